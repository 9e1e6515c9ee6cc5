"""The Hub calls publishing makes, each retried after a 429, a 5xx or a dropped connection.

A Hub that cannot be reached at all (connection refused, a host name with no address, no
route) is not retried: :class:`~zoo_convert.errors.HubUnreachableError` names the endpoint
at once. Retries never wait past the client's deadline (the publish's time budget).

Every request also draws from the process's Hub request budget once one is installed
(:mod:`zoo_convert.farm.hub_budget`, as the CLI does), which paces them, pauses every caller
after a 429 and sends a refused read again itself; the retries here cover what it
cannot send twice (a commit's streamed body) and the Hub's own hiccups.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ..errors import HubUnreachableError, PublishError, UsageError
from ..farm.hub_budget import retry_after
from ..sources import is_local

if TYPE_CHECKING:
    from huggingface_hub import CommitOperation
    from huggingface_hub.hf_api import RepoSibling

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_ENDPOINT = "https://huggingface.co"


class HubClient:
    """One token on one Hub endpoint.

    Attributes:
        endpoint: the Hub URL (huggingface_hub's default when None was given).
        max_retries: retries of one call after a 429, a 5xx or a connection error.
        backoff_s / max_backoff_s: first and largest wait between retries without Retry-After.
        deadline: ``time.monotonic()`` after which no retry is waited for (None: no limit).
    """

    def __init__(
        self,
        endpoint: str | None,
        token: str | None,
        *,
        max_retries: int = 8,
        backoff_s: float = 2.0,
        max_backoff_s: float = 600.0,
        deadline: float | None = None,
    ) -> None:
        from huggingface_hub import HfApi, constants

        self.api = HfApi(endpoint=endpoint, token=token or False)
        self.endpoint = (endpoint or constants.ENDPOINT or DEFAULT_ENDPOINT).rstrip("/")
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s
        self.deadline = deadline
        self._token = token

    def check_token(self) -> str:
        """The token's user name, in one request; a token the Hub refuses, or a read-only one, stops here."""
        import requests

        try:
            me = self.retry(lambda: self.api.whoami(), "check the token")
        except requests.HTTPError as exc:  # whoami raises a plain HTTPError for a 401
            status = exc.response.status_code if exc.response is not None else None
            if status in (401, 403):
                raise UsageError(
                    f"the Hub at {self.endpoint} refuses the token (HTTP {status}); "
                    "pass a valid write token with --token or HF_TOKEN"
                ) from None
            raise PublishError(f"cannot check the token at {self.endpoint}: HTTP {status}") from None
        role = ((me.get("auth") or {}).get("accessToken") or {}).get("role")
        if role == "read":
            raise UsageError(f"the token of {me.get('name')} is read-only; publishing needs a write token")
        return str(me.get("name"))

    def create_repo(self, repo_id: str, *, private: bool) -> None:
        """Create the repo unless it exists (an existing repo keeps its visibility)."""
        self.retry(lambda: self.api.create_repo(repo_id, private=private, exist_ok=True), f"create {repo_id}")

    def remote_files(self, repo_id: str) -> tuple[str | None, dict[str, RepoSibling]]:
        """The head sha and path -> sibling (size, blob id, LFS sha256) of the repo's main branch."""
        info = self.retry(lambda: self.api.model_info(repo_id, files_metadata=True), f"read {repo_id}")
        return info.sha, {s.rfilename: s for s in info.siblings or ()}

    def commit(self, repo_id: str, operations: list[CommitOperation], message: str, parent: str | None) -> str:
        """One commit on main whose parent must still be ``parent`` (a concurrent push answers 412)."""
        return self.retry(lambda: self._commit(repo_id, operations, message, parent), f"commit to {repo_id}")

    def license_of(self, source: str, revision: str | None, artifacts_dir: str | None) -> str | None:
        """The source's license from its model card (hub id or local folder), then its config.json."""
        import json

        from huggingface_hub import ModelCard

        found: object = None
        try:
            if is_local(source):
                readme = Path(source, "README.md")
                found = ModelCard.load(readme).data.license if readme.is_file() else None
            else:
                info = self.retry(lambda: self.api.model_info(source, revision=revision), f"read {source}")
                found = info.card_data.license if info.card_data else None
        except Exception as exc:  # noqa: BLE001 - a missing license must not block publishing
            log.debug("no license for %s: %s", source, type(exc).__name__)
        if found is None and artifacts_dir and Path(artifacts_dir, "config.json").is_file():
            found = json.loads(Path(artifacts_dir, "config.json").read_text()).get("license")
        return found if isinstance(found, str) else None

    def scrub(self, text: str) -> str:
        """``text`` with the token blanked out."""
        return text.replace(self._token, "***") if self._token else text

    def retry(self, fn: Callable[[], T], what: str) -> T:
        """Call ``fn``; after a 429, 5xx or dropped connection wait (Retry-After first) and call again.

        A Hub that cannot be reached raises :class:`HubUnreachableError` at once; a wait that
        would end past the deadline raises :class:`PublishError` instead of waiting.
        """
        attempt = 0
        while True:
            try:
                return fn()
            except Exception as exc:
                down = unreachable(exc)
                if down is not None:
                    raise HubUnreachableError(f"cannot reach the Hub at {self.endpoint}: {down}",
                                              endpoint=self.endpoint, reason=down) from None
                wait = self._retry_wait(exc, attempt)
                if wait is None or attempt >= self.max_retries:
                    raise
                if self.deadline is not None and time.monotonic() + wait > self.deadline:
                    raise PublishError(f"{what}: {_reason(exc)}; not retried, the publish's time budget is spent") from exc
                attempt += 1
                log.warning("%s: %s; retrying in %.1f s (%d/%d)", what, _reason(exc), wait, attempt, self.max_retries)
                time.sleep(wait)

    def _commit(self, repo_id: str, operations: list[CommitOperation], message: str, parent: str | None) -> str:
        from huggingface_hub import CommitOperationAdd

        # The client asks the LFS batch endpoint about every addition at once, so a file added
        # under two names (model_quantized.onnx = model_int8.onnx) would be uploaded twice. Upload
        # one of each content first: the commit then finds the others' content already there.
        adds = [op for op in operations if isinstance(op, CommitOperationAdd)]
        firsts = {op.upload_info.sha256: op for op in reversed(adds)}
        if len(firsts) < len(adds):  # preupload skips what an earlier attempt uploaded
            self.api.preupload_lfs_files(repo_id, list(firsts.values()))
        try:
            return str(self.api.create_commit(repo_id, operations, commit_message=message, parent_commit=parent).oid)
        except ValueError as exc:
            # huggingface_hub < 1.3.3 parses the returned commit URL against HF_ENDPOINT instead of
            # api.endpoint and raises after the commit landed (fixed upstream in huggingface_hub#3679).
            if "Unable to retrieve user and repo ID" not in str(exc):
                raise
            return str(self.api.model_info(repo_id).sha)

    def _retry_wait(self, exc: BaseException, attempt: int) -> float | None:
        """Seconds to wait before retrying, or None when the error is not worth retrying."""
        import requests

        backoff = min(self.backoff_s * 2.0**attempt, self.max_backoff_s)
        # The client wraps an upload thread's error in a RuntimeError; look down the cause chain.
        seen: BaseException | None = exc
        while seen is not None:
            response = getattr(seen, "response", None)
            if isinstance(seen, requests.HTTPError) and response is not None:
                status = response.status_code
                if status != 429 and status < 500:
                    return None
                after = retry_after(response.headers)
                return min(after, self.max_backoff_s) if after is not None else backoff
            if isinstance(seen, (requests.ConnectionError, requests.Timeout)):
                return backoff
            seen = seen.__cause__
        return None


# What a connection attempt answered when there is nobody to retry against.
_NO_ROUTE = {errno.ENETUNREACH: "network unreachable", errno.EHOSTUNREACH: "no route to host"}


def unreachable(exc: BaseException) -> str | None:
    """Why the Hub cannot be reached at all, when ``exc`` says so: refused, no DNS answer, no route; else None.

    A timeout, a reset or a dropped connection is not in this list: those are retried.
    Looks down the cause chain: the client wraps an upload thread's error in its own.
    """
    import requests

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, requests.Timeout):
            return None
        if isinstance(cur, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cur, socket.gaierror):
            return f"DNS lookup failed ({cur.strerror or cur})"
        if isinstance(cur, OSError) and cur.errno in _NO_ROUTE:
            return _NO_ROUTE[cur.errno]
        cur = cur.__cause__ or cur.__context__
    return None


def _reason(exc: BaseException) -> str:
    seen: BaseException | None = exc
    while seen is not None:
        # A requests.Response is falsy for error statuses: compare with None, never rely on truthiness.
        response = getattr(seen, "response", None)
        if response is not None:
            status = response.status_code
            return "rate limited (HTTP 429)" if status == 429 else f"HTTP {status}"
        seen = seen.__cause__
    return type(exc).__name__

"""One request budget for every Hub request a farm makes, in every process.

The Hub rations requests per token over 5-minute windows, in buckets: ``api``
(every ``/api/`` call: ``model_info``, listings, preupload, commits; 1,000 per 5
minutes on a free account) and ``resolvers`` (file downloads, ``/resolve/``;
5,000). Beyond that it answers 429 with ``Retry-After``. A farm that lets each
thread and worker find that out alone turns a limit into a retry storm, so all
of them draw from one :class:`Governor` instead::

    huggingface_hub call -> get_session() -> _GovernedSession.send
                                               | governor.acquire(bucket)   waits for a slot
                                               | send
                                               | 429? governor.pause(bucket, Retry-After), send again

:func:`install` hooks the governor into huggingface_hub (``configure_http_backend``),
so every request of the process goes through it, ours or the library's. A
:class:`LocalGovernor` serves the threads of one process; the farm injects one
backed by a Ray actor (``farm/driver.py``) so the driver and every worker share one
budget. Both keep the same arithmetic, :class:`Budget`: a sliding log of grant
times per bucket that never lets more than the limit through in any window (so
it also holds for the Hub's fixed windows, wherever they start), and a pause
after a 429 that holds back every caller of the bucket, not only the one that
was refused.

Requests to other hosts (LFS storage, CDNs) and other paths are not metered.
"""

from __future__ import annotations

import contextlib
import email.utils
import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import requests

BUCKETS = ("api", "resolvers")
# Sent again after a 429 at most this often; then the caller sees the 429.
MAX_REPLAYS = 5
# Wait after a 429 that says nothing about when to come back.
DEFAULT_PAUSE_S = 10.0
_RATELIMIT_T = re.compile(r"\bt=(\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class HubLimits:
    """Requests per bucket and window, as the Hub grants them to one token.

    Attributes:
        api: ``/api/`` requests per window (free account: 1,000 per 5 minutes).
        resolvers: ``/resolve/`` downloads per window (free account: 5,000 per 5 minutes).
        window_s: the window, seconds.
    """

    api: int = 1000
    resolvers: int = 5000
    window_s: float = 300.0

    def of(self, bucket: str) -> int:
        """The limit of one bucket."""
        return int(getattr(self, bucket))


def bucket_of(url: str) -> str | None:
    """The budget bucket a request URL draws from; None for requests the Hub does not meter."""
    path = urlsplit(url).path
    if "/resolve/" in path:
        return "resolvers"
    if "/api/" in path:
        return "api"
    return None


class Budget:
    """The pacing arithmetic, without a clock or a lock of its own (callers pass ``now``).

    Each bucket keeps the times it granted, oldest first; a request is granted at
    the earliest time at which the window before it holds fewer than the limit,
    never before an earlier grant (first come, first served) and never during a pause.
    A margin on the window absorbs the jitter between a grant and the request's
    arrival at the Hub.
    """

    def __init__(self, limits: HubLimits, history: Mapping[str, Iterable[float]] | None = None, now: float = 0.0) -> None:
        self.limits = limits
        # 0.5 s at least: a loaded 2-core CI machine delayed one request by more than 0.25 s between its grant
        # and the (in-process) Hub's stamp. The Hub's own 300 s windows get 9 s.
        self.window = limits.window_s + max(0.5, 0.03 * limits.window_s)
        self.grants: dict[str, deque[float]] = {b: deque(now + t for t in (history or {}).get(b, ())) for b in BUCKETS}
        self.paused: dict[str, float] = dict.fromkeys(BUCKETS, 0.0)

    def reserve(self, bucket: str, now: float) -> float:
        """Take the next slot of ``bucket``; returns the seconds to wait before sending."""
        grants, limit = self.grants[bucket], self.limits.of(bucket)
        while grants and grants[0] <= now - self.window:
            grants.popleft()
        at = max(now, self.paused[bucket], grants[-1] if grants else now)
        if len(grants) >= limit:
            at = max(at, grants[-limit] + self.window)
        grants.append(at)
        return at - now

    def pause(self, bucket: str, until: float) -> None:
        """Grant nothing in ``bucket`` before ``until``."""
        self.paused[bucket] = max(self.paused[bucket], until)

    def clear(self, bucket: str, now: float) -> bool:
        """Whether ``bucket`` is not paused at ``now`` (a slot granted before a pause began is void)."""
        return self.paused[bucket] <= now

    def history(self, now: float) -> dict[str, list[float]]:
        """Grant times relative to ``now`` (negative: in the past), to hand the budget over to another process."""
        return {b: [t - now for t in g if t > now - self.window] for b, g in self.grants.items()}


class Governor(Protocol):
    """Where a process draws its Hub requests from."""

    def acquire(self, bucket: str) -> None:
        """Block until one request of ``bucket`` may be sent."""

    def pause(self, bucket: str, seconds: float) -> None:
        """The Hub refused a request (429): hold every caller of ``bucket`` back for ``seconds``."""


class LocalGovernor:
    """A budget shared by the threads of one process."""

    def __init__(self, limits: HubLimits = HubLimits(), history: Mapping[str, Iterable[float]] | None = None) -> None:
        self._budget = Budget(limits, history, time.monotonic())
        self._lock = threading.Lock()

    def acquire(self, bucket: str) -> None:
        while True:
            with self._lock:
                wait = self._budget.reserve(bucket, time.monotonic())
            time.sleep(wait)
            with self._lock:
                if self._budget.clear(bucket, time.monotonic()):
                    return

    def pause(self, bucket: str, seconds: float) -> None:
        with self._lock:
            self._budget.pause(bucket, time.monotonic() + seconds)

    def history(self) -> dict[str, list[float]]:
        """What this budget granted lately, relative to now (see :meth:`Budget.history`)."""
        with self._lock:
            return self._budget.history(time.monotonic())


_installed: Governor | None = None


def install(governor: Governor | None) -> Governor | None:
    """Route every huggingface_hub request of this process through ``governor`` (None: the library's default).

    Returns the governor installed before, so a caller can put it back.
    """
    from huggingface_hub import configure_http_backend

    global _installed
    previous, _installed = _installed, governor
    if governor is None:
        configure_http_backend()
    else:
        configure_http_backend(lambda: _GovernedSession(governor))
    return previous


@contextlib.contextmanager
def governing(governor: Governor) -> Iterator[Governor]:
    """``install(governor)`` for the length of a ``with`` block, then put back what was there."""
    previous = install(governor)
    try:
        yield governor
    finally:
        install(previous)


def installed() -> Governor | None:
    """The governor this process's Hub requests go through, if any."""
    return _installed


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a 429 asks to wait: ``Retry-After`` (seconds or an HTTP date), else the Hub's ``RateLimit: ...;t=N``."""
    value = headers.get("Retry-After")
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                return max(0.0, when.timestamp() - time.time())
    match = _RATELIMIT_T.search(headers.get("RateLimit") or "")
    return float(match.group(1)) if match else None


class _GovernedSession(requests.Session):
    """The session huggingface_hub gets from ``get_session()`` once a governor is installed."""

    def __init__(self, governor: Governor) -> None:
        super().__init__()
        self.governor = governor

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        from huggingface_hub import constants
        from huggingface_hub.errors import OfflineModeIsEnabled

        if constants.HF_HUB_OFFLINE:
            raise OfflineModeIsEnabled(f"Cannot reach {request.url}: offline mode is enabled (HF_HUB_OFFLINE).")
        bucket = bucket_of(request.url or "")
        if bucket is None:
            return super().send(request, **kwargs)
        replays = 0
        while True:
            self.governor.acquire(bucket)
            response = super().send(request, **kwargs)
            if response.status_code != 429:
                return response
            wait = retry_after(response.headers)
            self.governor.pause(bucket, DEFAULT_PAUSE_S if wait is None else wait)
            # A streamed body (an upload) cannot be sent twice from here; its caller retries.
            if replays >= MAX_REPLAYS or not isinstance(request.body, (bytes, str, type(None))):
                return response
            replays += 1
            response.close()

"""Publish a run: one repo and one commit per verified model, nothing when the Hub already has it.

The Hub allows a token so many commits per hour (128). Publishing counts the commits
it made within the last hour (the ``publications`` table says), and when the budget
is spent it stops committing: the rest of the run is recorded ``deferred``, and the
next ``publish`` takes the deferred models first, oldest first, before its own run.
A deferred model whose repo a newer conversion also targets is ``superseded``, so no
repo gets two commits for one publish of one model.

A publish also has a time budget (``PublishOptions.max_time_s``): once it is spent no
model is started and no retry is waited for; the models left are ``deferred`` the same
way. A Hub that cannot be reached at all stops the publish at once
(:class:`~zoo_convert.errors.HubUnreachableError`), with what was done recorded.
"""

from __future__ import annotations

import logging
import re
import string
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..errors import HubUnreachableError, PublishError, UsageError
from ..records import variant_of
from ..store import ResultStore, queries
from .candidates import Candidate, load_candidates
from .card import model_card
from .files import hash_file, repo_files
from .hub import HubClient

if TYPE_CHECKING:
    from huggingface_hub import CommitOperation
    from huggingface_hub.hf_api import RepoSibling

log = logging.getLogger(__name__)

DEFAULT_REPO_TEMPLATE = "{namespace}/{name}-ONNX"
# The fields a --repo-template may use, and what each says of the model.
TEMPLATE_FIELDS = {
    "namespace": "the --namespace",
    "name": "the source's last path part",
    "owner": "the part before it (the hub id's organisation, a local folder's parent)",
    "model_type": "config.json's model_type",
    "exporter": "optimum or torch",
    "opset": "the ONNX opset",
    "revision": "the revision asked for (main when none was)",
}
# One publish stops starting models after this long (an hour: the commit budget's window).
DEFAULT_MAX_TIME_S = 3600.0


class PublicationStatus(str, Enum):
    """What publishing one model did, as stored in ``publications.status``."""

    PUBLISHED = "published"
    UNCHANGED = "unchanged"
    DRY_RUN = "dry_run"
    REFUSED = "refused"
    CONFLICT = "conflict"  # another model of the run targets the same repo (the command exits 1)
    FAILED = "failed"
    DEFERRED = "deferred"  # the commit budget was spent; the next publish takes it first
    SUPERSEDED = "superseded"  # deferred, then a newer conversion of the same repo came along

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class PublishOptions:
    """How and where to publish.

    Attributes:
        namespace: the Hub user or organisation that receives the repos.
        repo_template: repo id pattern; fields: see :data:`TEMPLATE_FIELDS`.
        endpoint: Hub URL; None is huggingface_hub's default (``HF_ENDPOINT``).
        private: create new repos private (existing repos keep their visibility).
        dry_run: plan and report, create and upload nothing.
        include_failed: also publish models whose verification failed (their failed variants too).
        max_retries: retries of one Hub call after a 429, a 5xx or a connection error.
        backoff_s / max_backoff_s: first and largest wait between retries without Retry-After.
        commits_per_hour: commits the token may make per ``commit_window_s`` (the Hub's: 128 an hour).
        commit_window_s: the window of that budget (an hour; shorter only in tests).
        max_time_s: the whole publish's time budget: past it no model is started (the rest is
            deferred) and no retry is waited for.
        only: publish only the models whose source, name (its last path part) or a tag is one of these.
        where: publish only the models with a ``results`` row of the run matching this SQL condition.
    """

    namespace: str
    repo_template: str = DEFAULT_REPO_TEMPLATE
    endpoint: str | None = None
    private: bool = False
    dry_run: bool = False
    include_failed: bool = False
    max_retries: int = 8
    backoff_s: float = 2.0
    max_backoff_s: float = 600.0
    commits_per_hour: int = 128
    commit_window_s: float = 3600.0
    max_time_s: float = DEFAULT_MAX_TIME_S
    only: tuple[str, ...] = ()
    where: str | None = None


@dataclass(frozen=True)
class Publication:
    """What publishing one model did; one row of the ``publications`` table.

    Attributes:
        status: see :class:`PublicationStatus`.
        commit_sha / commit_url: the repo's head after publishing (the new commit, or the existing one).
        files: files the repo holds for this model (card included).
        uploaded_files / uploaded_bytes: what this call sent (0 when unchanged).
        message: why it was refused or failed, or what a dry run would do.
    """

    run_id: str
    job_key: str
    source: str
    repo_id: str
    status: PublicationStatus
    commit_sha: str | None = None
    commit_url: str | None = None
    files: int = 0
    uploaded_files: int = 0
    uploaded_bytes: int = 0
    message: str | None = None

    def to_row(self) -> dict[str, Any]:
        """The ``publications`` row (without its timestamp)."""
        return {**asdict(self), "status": self.status.value}


@dataclass(frozen=True)
class Selection:
    """Which models of a run a publish takes.

    Attributes:
        run_id: the run.
        job_keys: the selected jobs (every job of the run when nothing was asked).
        total: jobs the run recorded.
        asked: the selection as given (``--only bert,gpt2 --where "..."``), empty for all.
    """

    run_id: str
    job_keys: frozenset[str]
    total: int
    asked: str = ""

    def describe(self) -> str:
        """One line: how many models of which run, selected how."""
        what = f"{len(self.job_keys)} of {self.total} model(s) of run {self.run_id}"
        return f"{what}, selected by {self.asked}" if self.asked else what


def select(store: ResultStore, run_id: str, options: PublishOptions, *, strict: bool = True) -> Selection:
    """The run's jobs that ``options.only`` and ``options.where`` select (both when both are given).

    An ``--only`` value that names no model of the run (unless not ``strict``), and a
    ``--where`` the DB cannot run, are usage errors, said with the value.
    """
    rows = queries.query(store, "SELECT job_key, any_value(source), flatten(list(tags)) FROM results"
                         " WHERE run_id = ? GROUP BY job_key", [run_id])[1]
    keys = {str(k) for k, _, _ in rows}
    asked = []
    if options.only:
        names = {str(k): {str(src), _name_of(str(src)), *(t for t in tags or () if t)} for k, src, tags in rows}
        unknown = [o for o in options.only if not any(o in n for n in names.values())]
        if unknown and strict:
            raise UsageError(f"--only {','.join(unknown)}: no model of run {run_id} has that source, name or tag")
        keys = {k for k, n in names.items() if n & set(options.only)}
        asked.append(f"--only {','.join(options.only)}")
    if options.where:
        where = options.where
        # On a read-only connection: the condition can read the DB, never change it.
        try:
            found = queries.query(ResultStore(store.path, read_only=True),
                                  f"SELECT DISTINCT job_key FROM results WHERE run_id = ? AND ({where})", [run_id])[1]
        except UsageError as exc:
            reason = exc.message.removeprefix("query failed: ").splitlines()[0]  # DuckDB adds the SQL and a caret
            raise UsageError(f"bad --where {where!r}: {reason}") from None
        keys &= {str(k) for (k,) in found}
        asked.append(f"--where {where!r}")
    return Selection(run_id, frozenset(keys), len(rows), " ".join(asked))


def publish_run(store: ResultStore, options: PublishOptions, *, run: str = "latest", token: str | None = None) -> list[Publication]:
    """Publish what earlier publishes deferred, then every selected candidate of ``run`` (a run id or ``latest``),
    within the commit and time budgets; record each outcome unless dry-run.

    The token is checked once before anything else: a token the Hub refuses stops here, and so
    does a Hub that cannot be reached (:class:`~zoo_convert.errors.HubUnreachableError`, raised
    at whatever point the Hub goes away, after recording what was done).
    """
    started = time.monotonic()
    _check_template(options.repo_template)
    if not token and not options.dry_run:
        raise UsageError("publishing needs a Hub token: pass --token, set HF_TOKEN or run `huggingface-cli login`")
    run_id = queries.find_run(store, run)
    selection = select(store, run_id, options)
    deadline = started + options.max_time_s
    client = HubClient(options.endpoint, token, max_retries=options.max_retries, backoff_s=options.backoff_s,
                       max_backoff_s=options.max_backoff_s, deadline=deadline)
    if token:
        client.check_token()
    deferred = _deferred(store, options)
    queue = [*deferred, *(c for c in load_candidates(store, run_id, sorted(selection.job_keys))
                          if c.job_key not in {d.job_key for d in deferred})]
    since = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(seconds=options.commit_window_s)
    commits_left = options.commits_per_hour - queries.commits_since(store, since)
    newer: set[int] = set()  # positions whose repo a later candidate targets too
    seen: set[str] = set()
    for i in range(len(queue) - 1, -1, -1):
        repo_id = repo_id_for(queue[i], options)
        if repo_id in seen:
            newer.add(i)
        seen.add(repo_id)
    out: list[Publication] = []
    claimed: dict[str, Candidate] = {}
    done = queries.published_jobs(store)
    try:
        for i, c in enumerate(queue):
            repo_id = repo_id_for(c, options)
            base = Publication(c.run_id, c.job_key, c.source, repo_id, PublicationStatus.FAILED)
            out_of_time = time.monotonic() >= deadline
            if (commits_left <= 0 or out_of_time) and (c.job_key, repo_id) in done:
                continue  # published before; with commits and time to spare it is checked again, else left as it is
            if i < len(deferred) and i in newer:
                pub = replace(base, status=PublicationStatus.SUPERSEDED,
                              message="a newer conversion of this model is published to the same repo instead")
            elif repo_id in claimed:
                pub = replace(base, status=PublicationStatus.CONFLICT, message=_conflict(c, claimed[repo_id], options))
            elif (commits_left <= 0 or out_of_time) and (c.passed or options.include_failed):
                spent = (f"the time budget (--max-time {options.max_time_s:g} s)" if out_of_time else
                         f"the commit budget ({options.commits_per_hour} per {options.commit_window_s / 3600:g} h)")
                pub = replace(base, status=PublicationStatus.DEFERRED,
                              message=f"{spent} is spent; the next publish takes it first")
            else:
                claimed[repo_id] = c
                pub = publish_candidate(client, c, options)
                if pub.status in (PublicationStatus.PUBLISHED, PublicationStatus.DRY_RUN):
                    commits_left -= 1
            log.info("%s %s: %s", pub.status, repo_id, pub.message or pub.commit_url or "")
            out.append(pub)
            if not options.dry_run and pub.status is not PublicationStatus.DEFERRED:
                store.record_publication(pub.to_row())
    finally:
        if not options.dry_run:  # in one go: at the Hub's scale most of a night's models wait
            store.record_publications([p.to_row() for p in out if p.status is PublicationStatus.DEFERRED])
    return out


def _template_fields(c: Candidate, options: PublishOptions) -> dict[str, object]:
    """The values of :data:`TEMPLATE_FIELDS` for one candidate."""
    parts = c.source.rstrip("/").replace("\\", "/").split("/")
    return {
        "namespace": options.namespace,
        "name": _name_of(c.source) or "model",
        "owner": _hub_safe(parts[-2]) if len(parts) > 1 and _hub_safe(parts[-2]) else "local",
        "model_type": c.model_type or "model",
        "exporter": c.exporter or "optimum",
        "opset": c.opset if c.opset is not None else "default",
        "revision": _hub_safe(c.revision or "main") or "rev",
    }


def _name_of(source: str) -> str:
    return _hub_safe(source.rstrip("/").replace("\\", "/").split("/")[-1])


def _hub_safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")


def repo_id_for(c: Candidate, options: PublishOptions) -> str:
    """The target repo id from the template; the name is the source's last path part, Hub-safe."""
    repo_id = _render(options.repo_template, **_template_fields(c, options))
    if repo_id.count("/") != 1 or not all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}", p) for p in repo_id.split("/")):
        raise UsageError(f"--repo-template gives {repo_id!r}, not a valid 'namespace/name' repo id")
    return repo_id


def _conflict(c: Candidate, first: Candidate, options: PublishOptions) -> str:
    """Why ``c`` is not published to the repo ``first`` took, and a --repo-template that keeps the two apart."""
    repo_id = repo_id_for(c, options)
    taken = f"{repo_id} is already taken by {first.source} in this run"
    for template in _templates_apart(options.repo_template):
        other = replace(options, repo_template=template)
        try:
            if repo_id_for(c, other) != repo_id_for(first, other):
                return f"{taken}; --repo-template '{template}' keeps them apart"
        except UsageError:  # the extra field makes an invalid repo id for one of them
            continue
    return (f"{taken}, converted with the same source, revision, exporter and opset; "
            "publish one of them with --only or --where")


def _templates_apart(template: str) -> Iterable[str]:
    """The template with one more field that could tell two models apart, in order of how natural it reads."""
    for field_ in ("owner", "exporter", "opset", "revision", "model_type"):
        if "{" + field_ + "}" in template:
            continue
        if "{name}" in template:
            yield template.replace("{name}", "{owner}-{name}" if field_ == "owner" else "{name}-{" + field_ + "}")
        else:
            yield template + "-{" + field_ + "}"


def publish_candidate(client: HubClient | None, c: Candidate, options: PublishOptions) -> Publication:
    """Publish one model in one commit, or nothing when the Hub already has the same files; never raises.

    ``client`` may be None for a candidate that will be refused without asking the Hub.
    """
    repo_id = repo_id_for(c, options)
    base = Publication(c.run_id, c.job_key, c.source, repo_id, PublicationStatus.FAILED)
    if not c.passed and not options.include_failed:
        return replace(base, status=PublicationStatus.REFUSED,
                       message="verification failed; pass --include-failed to publish it anyway")
    if client is None:
        raise ValueError("publishing a candidate needs a HubClient")
    try:
        return _publish(client, c, options, base)
    except HubUnreachableError:
        raise  # not this model's failure: the publish stops
    except Exception as exc:  # noqa: BLE001 - one model's failure is recorded, the others go on
        text = client.scrub((str(exc).strip().splitlines() or [type(exc).__name__])[0])
        return replace(base, status=PublicationStatus.FAILED, message=f"{type(exc).__name__}: {text}"[:2000])


def _publish(client: HubClient, c: Candidate, options: PublishOptions, base: Publication) -> Publication:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete
    from huggingface_hub.errors import HfHubHTTPError

    repo_id = base.repo_id
    local = {p: hash_file(f) for p, f in repo_files(c, include_failed=options.include_failed).items()}
    variants = {variant_of(p) for p in local if p.endswith(".onnx")}
    n_files = len(local) + 1
    url = f"{client.endpoint}/{repo_id}"
    # A commit names its parent, so a concurrent push answers 412 and we compare again.
    for _ in range(3):
        head, remote = _remote_files(client, repo_id, options)
        changed = [p for p, f in local.items() if not f.same_as(remote.get(p))]
        stale = [p for p in remote if p.startswith("onnx/") and p not in local]
        if not changed and not stale and "README.md" in remote:
            return replace(base, status=PublicationStatus.UNCHANGED, commit_sha=head, commit_url=f"{url}/commit/{head}",
                           files=n_files, message="the Hub already has these files")
        source_license = client.license_of(c.source, c.resolved_revision, c.artifacts_dir)
        card = model_card(c, repo_id, variants={v for v in variants if v}, endpoint=options.endpoint,
                          license=source_license).encode()
        # A second name of the same graph (model_int8.onnx = model_quantized.onnx) is no second upload.
        remote_lfs = {r.lfs.sha256 for r in remote.values() if r is not None and r.lfs is not None}
        sent = sum({local[p].sha256: local[p].size for p in changed if local[p].sha256 not in remote_lfs}.values())
        sent += len(card)
        if options.dry_run:
            return replace(base, status=PublicationStatus.DRY_RUN, commit_sha=head, files=n_files,
                           uploaded_files=len(changed) + 1, uploaded_bytes=sent,
                           message=f"would upload {len(changed)} file(s) + README.md"
                           + (f" and delete {len(stale)}" if stale else "") + f" to {url}")
        ops: list[CommitOperation] = [CommitOperationAdd(p, str(local[p].path)) for p in changed]
        ops += [CommitOperationAdd("README.md", card), *(CommitOperationDelete(p) for p in stale)]
        message = f"zoo_convert: {c.source}@{(c.resolved_revision or '').split(':')[-1][:12]} ({c.exporter}, opset {c.opset})"
        try:
            sha = client.commit(repo_id, ops, message, head)
        except HfHubHTTPError as exc:
            if exc.response is not None and exc.response.status_code == 412:
                continue
            raise
        return replace(base, status=PublicationStatus.PUBLISHED, commit_sha=sha, commit_url=f"{url}/commit/{sha}",
                       files=n_files, uploaded_files=len(changed) + 1, uploaded_bytes=sent)
    raise PublishError(f"{repo_id} kept changing under us; gave up after 3 attempts")


def _remote_files(client: HubClient, repo_id: str, options: PublishOptions) -> tuple[str | None, dict[str, RepoSibling]]:
    """The repo's head and files; a missing repo is created first (asked after, so an existing one costs one request)."""
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        return client.remote_files(repo_id)
    except RepositoryNotFoundError:
        if options.dry_run:
            return None, {}
    client.create_repo(repo_id, private=options.private)
    return client.remote_files(repo_id)


def _deferred(store: ResultStore, options: PublishOptions) -> list[Candidate]:
    """Candidates earlier publishes deferred to the same repos these options target, oldest first."""
    rows = queries.deferred_publications(store)
    if options.only or options.where:  # a selection holds for what waits from earlier publishes too
        picked = {run_id: select(store, run_id, options, strict=False).job_keys for run_id in {r["run_id"] for r in rows}}
        rows = [r for r in rows if r["job_key"] in picked[r["run_id"]]]
    by_run: dict[str, list[str]] = {}
    for r in rows:
        by_run.setdefault(r["run_id"], []).append(r["job_key"])
    found = {(c.run_id, c.job_key): c for run_id, keys in by_run.items() for c in load_candidates(store, run_id, keys)}
    return [
        found[(r["run_id"], r["job_key"])]
        for r in rows
        if (r["run_id"], r["job_key"]) in found and repo_id_for(found[(r["run_id"], r["job_key"])], options) == r["repo_id"]
    ]


def _check_template(template: str) -> None:
    _render(template, **{**dict.fromkeys(TEMPLATE_FIELDS, "x"), "opset": 1})


def _render(template: str, **values: object) -> str:
    """The template with its fields filled in: only the documented names, no attribute or index access, no format
    spec, nothing evaluated (``str.format`` would look up ``{name.__class__.__mro__}`` before any check)."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise UsageError(f"bad --repo-template {template!r}: {exc}") from exc
    out: list[str] = []
    for literal, field, spec, conversion in parts:
        out.append(literal)
        if field is None:
            continue
        if field not in TEMPLATE_FIELDS or spec or conversion:
            raise UsageError(
                f"bad --repo-template {template!r}: {{{field}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}"
                f" is not one of {', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)}"
            )
        out.append(str(values[field]))
    return "".join(out)

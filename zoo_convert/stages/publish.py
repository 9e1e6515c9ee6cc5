"""Publish stage: verified artifact folders -> one HuggingFace Hub repo per model.

For every model of a run that passed verification, ``publish_run`` builds the
repo a runtime loads directly (``onnx/*.onnx`` with external data, the config,
tokenizer and processor files, and a ``README.md`` model card) and pushes it as
ONE commit, so a repo is never half-published. Before committing it compares
each local file's sha256 (git blob sha1 for non-LFS files) with what the Hub
already has: when every artifact matches, nothing is uploaded and no commit is
made, so a nightly rerun costs one request per model, and a run that stopped
half-way resumes by publishing only what is still missing. 429 and 5xx answers
are retried, honouring ``Retry-After``.

The Hub token is passed in explicitly (the CLI reads ``HF_TOKEN`` or the
huggingface_hub login); it is never logged, stored or written into a card, and
any message recorded is scrubbed of it.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import PublishError, UsageError
from ..records import PASSED, VARIANT_FILES, VARIANTS
from ..sources import is_local

if TYPE_CHECKING:
    from ..store import ResultStore

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_REPO_TEMPLATE = "{namespace}/{name}-ONNX"
DEFAULT_ENDPOINT = "https://huggingface.co"

# Publication.status values, as stored in the ``publications`` table.
PUBLISHED, UNCHANGED, DRY_RUN, REFUSED, FAILED = "published", "unchanged", "dry_run", "refused", "failed"

# optimum task -> Hub pipeline tag (the ``-with-past`` suffix is stripped first).
PIPELINE_TAGS = {
    "feature-extraction": "feature-extraction",
    "sentence-similarity": "sentence-similarity",
    "fill-mask": "fill-mask",
    "text-classification": "text-classification",
    "token-classification": "token-classification",
    "question-answering": "question-answering",
    "multiple-choice": "multiple-choice",
    "text-generation": "text-generation",
    "text2text-generation": "text2text-generation",
    "image-classification": "image-classification",
    "object-detection": "object-detection",
    "semantic-segmentation": "image-segmentation",
    "image-segmentation": "image-segmentation",
    "depth-estimation": "depth-estimation",
    "image-to-text": "image-to-text",
    "zero-shot-image-classification": "zero-shot-image-classification",
    "audio-classification": "audio-classification",
    "automatic-speech-recognition": "automatic-speech-recognition",
}
# Hub pipeline tag -> the optimum.onnxruntime class that loads it (as optimum's own pipelines map it).
ORT_CLASSES = {
    "feature-extraction": "ORTModelForFeatureExtraction",
    "sentence-similarity": "ORTModelForFeatureExtraction",
    "fill-mask": "ORTModelForMaskedLM",
    "text-classification": "ORTModelForSequenceClassification",
    "token-classification": "ORTModelForTokenClassification",
    "question-answering": "ORTModelForQuestionAnswering",
    "multiple-choice": "ORTModelForMultipleChoice",
    "text-generation": "ORTModelForCausalLM",
    "text2text-generation": "ORTModelForSeq2SeqLM",
    "image-classification": "ORTModelForImageClassification",
    "image-segmentation": "ORTModelForSemanticSegmentation",
    "image-to-text": "ORTModelForVision2Seq",
    "zero-shot-image-classification": "ORTModelForZeroShotImageClassification",
    "audio-classification": "ORTModelForAudioClassification",
    "automatic-speech-recognition": "ORTModelForSpeechSeq2Seq",
}
# transformers.js ``dtype`` option that selects each variant's file.
JS_DTYPES = {"fp32": "fp32", "fp16": "fp16", "int8": "q8"}
# Files written beside onnx/ that are records of ours, not part of the model.
_PRIVATE_FILES = {"result.json", "README.md"}


@dataclass(frozen=True)
class PublishOptions:
    """How and where to publish.

    Attributes:
        namespace: the Hub user or organisation that receives the repos.
        repo_template: repo id pattern; fields: namespace, name, model_type, exporter, opset.
        endpoint: Hub URL; None is huggingface_hub's default (``HF_ENDPOINT``).
        private: create new repos private (existing repos keep their visibility).
        dry_run: plan and report, create and upload nothing.
        include_failed: also publish models whose verification failed (their failed variants too).
        max_retries: retries of one Hub call after a 429, a 5xx or a connection error.
        backoff_s / max_backoff_s: first and largest wait between retries without Retry-After.
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


@dataclass(frozen=True)
class VariantRow:
    """One variant of a candidate, as the results DB recorded it."""

    variant: str
    status: str
    file: str | None
    size_bytes: int | None = None
    max_abs: float | None = None
    min_cosine: float | None = None
    ort_p50_ms: float | None = None
    torch_p50_ms: float | None = None
    speedup: float | None = None


@dataclass(frozen=True)
class Candidate:
    """One converted model of a run, everything publishing needs from the results DB.

    Attributes:
        run_id / job_key: where it was recorded.
        source / revision / resolved_revision: the checkpoint it came from.
        task / model_type / exporter / opset: how it was converted.
        job_status: passed or failed, as the pipeline decided.
        artifacts_dir: folder holding onnx/ and the side files.
        versions: toolchain versions it was converted and verified with.
        finished_at: when verification finished (ISO-8601, UTC).
        variants: per-variant results.
        tolerances: the run's max_abs tolerance per variant, when the run recorded it.
    """

    run_id: str
    job_key: str
    source: str
    revision: str | None
    resolved_revision: str | None
    task: str | None
    model_type: str | None
    exporter: str | None
    opset: int | None
    job_status: str
    artifacts_dir: str | None
    versions: dict[str, str] = field(default_factory=dict)
    finished_at: str | None = None
    variants: tuple[VariantRow, ...] = ()
    tolerances: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.job_status == PASSED


@dataclass(frozen=True)
class Publication:
    """What publishing one model did; one row of the ``publications`` table.

    Attributes:
        status: published, unchanged, dry_run, refused or failed.
        commit_sha / commit_url: the repo's head after publishing (the new commit, or the existing one).
        files: files the repo holds for this model (card included).
        uploaded_files / uploaded_bytes: what this call sent (0 when unchanged).
        message: why it was refused or failed, or what a dry run would do.
    """

    run_id: str
    job_key: str
    source: str
    repo_id: str
    status: str
    commit_sha: str | None = None
    commit_url: str | None = None
    files: int = 0
    uploaded_files: int = 0
    uploaded_bytes: int = 0
    message: str | None = None

    def to_row(self) -> dict[str, Any]:
        """The ``publications`` row (without its timestamp)."""
        return asdict(self)


@dataclass(frozen=True)
class _LocalFile:
    path: Path
    size: int
    sha256: str
    git_oid: str


def publish_run(store: ResultStore, options: PublishOptions, *, run: str = "latest", token: str | None = None) -> list[Publication]:
    """Publish every candidate of ``run`` (a run id or ``latest``); record each outcome unless dry-run."""
    from huggingface_hub import HfApi

    _check_template(options.repo_template)
    run_id = resolve_run(store, run)
    candidates = load_candidates(store, run_id)
    api = HfApi(endpoint=options.endpoint, token=token or False)
    out: list[Publication] = []
    claimed: dict[str, str] = {}
    for c in candidates:
        repo_id = repo_id_for(c, options)
        if repo_id in claimed:
            pub = Publication(c.run_id, c.job_key, c.source, repo_id, REFUSED, message=(
                f"{repo_id} is already taken by {claimed[repo_id]} in this run; "
                "put {exporter} or {opset} in --repo-template to keep them apart"))
        else:
            claimed[repo_id] = c.job_key
            pub = publish_candidate(api, c, options, token=token)
        log.info("%s %s: %s", pub.status, repo_id, pub.message or pub.commit_url or "")
        if not options.dry_run:
            store.record_publication(pub.to_row())
        out.append(pub)
    return out


def resolve_run(store: ResultStore, run: str) -> str:
    """``latest`` -> the newest run id; any other value must name a recorded run."""
    with store.connect() as con:
        if run == "latest":
            row = con.execute("SELECT run_id FROM runs ORDER BY run_seq DESC LIMIT 1").fetchone()
            if row is None:
                raise UsageError(f"{store.path} has no runs yet")
            return row[0]
        if con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run]).fetchone() is None:
            raise UsageError(f"no run {run!r} in {store.path}")
    return run


def load_candidates(store: ResultStore, run_id: str) -> list[Candidate]:
    """Every job of a run with its variants, in the order the run recorded them."""
    with store.connect() as con:
        settings = con.execute("SELECT settings FROM runs WHERE run_id = ?", [run_id]).fetchone()
        cur = con.execute("SELECT * FROM results WHERE run_id = ? ORDER BY job_seq, variant", [run_id])
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
    tolerances = _tolerances(settings[0] if settings else None)
    jobs: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        jobs.setdefault(r["job_key"], []).append(r)
    return [_candidate(job_rows, tolerances) for job_rows in jobs.values()]


def repo_id_for(c: Candidate, options: PublishOptions) -> str:
    """The target repo id from the template; the name is the source's last path part, Hub-safe."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", c.source.rstrip("/").replace("\\", "/").split("/")[-1]).strip("-.")
    repo_id = options.repo_template.format(
        namespace=options.namespace,
        name=name or "model",
        model_type=c.model_type or "model",
        exporter=c.exporter or "optimum",
        opset=c.opset if c.opset is not None else "default",
    )
    if repo_id.count("/") != 1 or not all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}", p) for p in repo_id.split("/")):
        raise UsageError(f"--repo-template gives {repo_id!r}, not a valid 'namespace/name' repo id")
    return repo_id


def repo_files(c: Candidate, *, include_failed: bool = False) -> dict[str, Path]:
    """Path in repo -> local file: the side files and the ONNX graphs (+ external data) of published variants."""
    if not c.artifacts_dir or not Path(c.artifacts_dir, "onnx").is_dir():
        raise PublishError(f"{c.source}: no onnx/ folder under {c.artifacts_dir!r}")
    root = Path(c.artifacts_dir)
    files = {p.name: p for p in sorted(root.iterdir()) if p.is_file() and p.name not in _PRIVATE_FILES}
    wanted = {v.variant for v in c.variants if v.status == PASSED or include_failed}
    for graph in sorted((root / "onnx").glob("*.onnx")):
        if _variant_of(graph.name) not in wanted:
            continue
        for p in (graph, *_external_data(graph)):
            files[p.relative_to(root).as_posix()] = p
    if not any(k.endswith(".onnx") for k in files):
        raise PublishError(f"{c.source}: no verified ONNX graph to publish in {root}")
    return files


def model_card(
    c: Candidate,
    repo_id: str,
    *,
    variants: Iterable[str] | None = None,
    endpoint: str | None = None,
    license: str | None = None,
) -> str:
    """The README.md text: Hub metadata, what was verified, how to load it; deterministic per candidate.

    ``variants`` are the ones the repo holds (default: those that passed).
    """
    from huggingface_hub import ModelCard, ModelCardData

    hub = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
    pipeline_tag = PIPELINE_TAGS.get((c.task or "").removesuffix("-with-past"))
    from_hub = not is_local(c.source)
    data = ModelCardData(
        base_model=c.source if from_hub else None,
        library_name="transformers.js",
        pipeline_tag=pipeline_tag,
        license=license,
        tags=["onnx", "onnxruntime", "optimum", "transformers.js", "zoo-convert", *([c.model_type] if c.model_type else [])],
    )
    name = repo_id.split("/")[-1]
    rev = (c.resolved_revision or "").split(":")[-1][:12]
    origin = (
        f"[`{c.source}`]({hub}/{c.source}) at revision `{rev}`"
        if from_hub
        else f"a local checkpoint `{Path(c.source).name}` (content hash `{rev}`)"
    )
    in_repo = set(variants) if variants is not None else {v.variant for v in c.variants if v.status == PASSED}
    published = [v for v in c.variants if v.variant in in_repo]
    dtypes = [JS_DTYPES[v.variant] for v in published if v.variant in JS_DTYPES] or ["fp32"]
    lines = [
        f"# {name}",
        "",
        f"ONNX export of {origin}, made with {c.exporter or 'optimum'} at opset {c.opset} by zoo_convert "
        "and verified against PyTorch with ONNX Runtime before publishing.",
        "",
        "## Verification",
        "",
        "| variant | file | size | max abs error | tolerance | min cosine | ORT p50 | PyTorch p50 | speedup | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        *(
            f"| {v.variant} | {f'`{v.file}`' if v.variant in in_repo else 'not published'} | {_mb(v.size_bytes)} "
            f"| {_sci(v.max_abs)} | {_sci(c.tolerances.get(v.variant))} | {_fixed(v.min_cosine, 6)} "
            f"| {_fixed(v.ort_p50_ms, 2, ' ms')} | {_fixed(v.torch_p50_ms, 2, ' ms')} | {_fixed(v.speedup, 2, 'x')} "
            f"| {v.status} |"
            for v in c.variants
        ),
        "",
        f"Task `{c.task}`, model type `{c.model_type}`, verified {(c.finished_at or '')[:10]} with "
        + ", ".join(f"{k} {v}" for k, v in sorted(c.versions.items()))
        + ".",
        "",
        "## Usage",
        "",
        "With [Optimum](https://huggingface.co/docs/optimum-onnx) and ONNX Runtime:",
        "",
        "```python",
        f"from optimum.onnxruntime import {ORT_CLASSES.get(pipeline_tag or '', 'ORTModel')}",
        "",
        f'model = {ORT_CLASSES.get(pipeline_tag or "", "ORTModel")}.from_pretrained("{repo_id}", subfolder="onnx")',
        *(
            f'# {v.variant}: file_name="{Path(v.file).name}"'
            for v in published
            if v.variant != "fp32" and v.file
        ),
        "```",
        "",
        "With [Transformers.js](https://huggingface.co/docs/transformers.js):",
        "",
        "```js",
        "import { pipeline } from '@huggingface/transformers';",
        "",
        f"const pipe = await pipeline('{pipeline_tag or c.task}', '{repo_id}', {{ dtype: '{dtypes[0]}' }});"
        + (f"  // or {', '.join(repr(d) for d in dtypes[1:])}" if dtypes[1:] else ""),
        "```",
        "",
    ]
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))
    return str(card)


def publish_candidate(api: Any, c: Candidate, options: PublishOptions, *, token: str | None = None) -> Publication:
    """Publish one model in one commit, or nothing when the Hub already has the same files; never raises."""
    repo_id = repo_id_for(c, options)
    base = Publication(c.run_id, c.job_key, c.source, repo_id, FAILED)
    if not c.passed and not options.include_failed:
        return replace(base, status=REFUSED, message="verification failed; pass --include-failed to publish it anyway")
    try:
        return _publish(api, c, options, base)
    except Exception as exc:  # noqa: BLE001 - one model's failure is recorded, the others go on
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if token:
            text = text.replace(token, "***")
        return replace(base, status=FAILED, message=f"{type(exc).__name__}: {text}"[:2000])


def _publish(api: Any, c: Candidate, options: PublishOptions, base: Publication) -> Publication:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    repo_id = base.repo_id
    local = {p: _hash(f) for p, f in repo_files(c, include_failed=options.include_failed).items()}
    variants = {_variant_of(p) for p in local if p.endswith(".onnx")}
    n_files = len(local) + 1
    hub = (options.endpoint or DEFAULT_ENDPOINT).rstrip("/")
    if not options.dry_run:
        _retry(lambda: api.create_repo(repo_id, private=options.private, exist_ok=True), options, f"create {repo_id}")
    # A commit names its parent, so a concurrent push answers 412 and we compare again.
    for _ in range(3):
        try:
            head, remote = _retry(lambda: _remote_files(api, repo_id), options, f"read {repo_id}")
        except RepositoryNotFoundError:
            if not options.dry_run:
                raise
            head, remote = None, {}
        changed = [p for p, f in local.items() if not _same(f, remote.get(p))]
        stale = [p for p in remote if p.startswith("onnx/") and p not in local]
        if not changed and not stale and "README.md" in remote:
            return replace(base, status=UNCHANGED, commit_sha=head, commit_url=f"{hub}/{repo_id}/commit/{head}",
                           files=n_files, message="the Hub already has these files")
        source_license = _source_license(api, c, options)
        card = model_card(c, repo_id, variants=variants, endpoint=options.endpoint, license=source_license).encode()
        sent = sum(local[p].size for p in changed) + len(card)
        if options.dry_run:
            return replace(base, status=DRY_RUN, commit_sha=head, files=n_files, uploaded_files=len(changed) + 1,
                           uploaded_bytes=sent, message=f"would upload {len(changed)} file(s) + README.md"
                           + (f" and delete {len(stale)}" if stale else "") + f" to {hub}/{repo_id}")
        ops: list[Any] = [CommitOperationAdd(p, str(local[p].path)) for p in changed]
        ops += [CommitOperationAdd("README.md", card), *(CommitOperationDelete(p) for p in stale)]
        message = f"zoo_convert: {c.source}@{(c.resolved_revision or '').split(':')[-1][:12]} ({c.exporter}, opset {c.opset})"
        try:
            sha = _retry(lambda: _commit(api, repo_id, ops, message, head), options, f"commit to {repo_id}")
        except HfHubHTTPError as exc:
            if exc.response is not None and exc.response.status_code == 412:
                continue
            raise
        return replace(base, status=PUBLISHED, commit_sha=sha, commit_url=f"{hub}/{repo_id}/commit/{sha}",
                       files=n_files, uploaded_files=len(changed) + 1, uploaded_bytes=sent)
    raise PublishError(f"{repo_id} kept changing under us; gave up after 3 attempts")


def _commit(api: Any, repo_id: str, ops: list[Any], message: str, parent: str | None) -> str:
    try:
        return api.create_commit(repo_id, ops, commit_message=message, parent_commit=parent).oid
    except ValueError as exc:
        # huggingface_hub < 1.3.3 parses the returned commit URL against HF_ENDPOINT instead of
        # api.endpoint and raises after the commit landed (fixed upstream in huggingface_hub#3679).
        if "Unable to retrieve user and repo ID" not in str(exc):
            raise
        return api.model_info(repo_id).sha


def _remote_files(api: Any, repo_id: str) -> tuple[str, dict[str, Any]]:
    """The head sha and path -> sibling (size, blob id, LFS sha256) of the repo's main branch."""
    info = api.model_info(repo_id, files_metadata=True)
    return info.sha, {s.rfilename: s for s in info.siblings or ()}


def _same(local: _LocalFile, remote: Any) -> bool:
    if remote is None:
        return False
    if remote.lfs is not None:
        return remote.lfs.sha256 == local.sha256
    return remote.blob_id == local.git_oid


def _hash(path: Path) -> _LocalFile:
    """sha256 (LFS oid) and git blob sha1 of a file in one pass."""
    size = path.stat().st_size
    sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            sha256.update(chunk)
            sha1.update(chunk)
    return _LocalFile(path, size, sha256.hexdigest(), sha1.hexdigest())


def _source_license(api: Any, c: Candidate, options: PublishOptions) -> str | None:
    """The source's license from its model card (hub id or local folder), then its config.json."""
    from huggingface_hub import ModelCard

    found: Any = None
    try:
        if is_local(c.source):
            readme = Path(c.source, "README.md")
            found = ModelCard.load(readme).data.license if readme.is_file() else None
        else:
            info = _retry(lambda: api.model_info(c.source, revision=c.resolved_revision), options, f"read {c.source}")
            found = info.card_data.license if info.card_data else None
    except Exception as exc:  # noqa: BLE001 - a missing license must not block publishing
        log.debug("no license for %s: %s", c.source, type(exc).__name__)
    if found is None and c.artifacts_dir and Path(c.artifacts_dir, "config.json").is_file():
        found = json.loads(Path(c.artifacts_dir, "config.json").read_text()).get("license")
    return found if isinstance(found, str) else None


def _retry(fn: Callable[[], T], options: PublishOptions, what: str) -> T:
    """Call ``fn``; after a 429, 5xx or connection error wait (Retry-After first) and call again."""
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            wait = _retry_wait(exc, attempt, options)
            if wait is None or attempt >= options.max_retries:
                raise
            attempt += 1
            log.warning("%s: %s; retrying in %.1f s (%d/%d)", what, _reason(exc), wait, attempt, options.max_retries)
            time.sleep(wait)


def _retry_wait(exc: BaseException, attempt: int, options: PublishOptions) -> float | None:
    """Seconds to wait before retrying, or None when the error is not worth retrying."""
    import requests

    backoff = min(options.backoff_s * 2**attempt, options.max_backoff_s)
    # The client wraps an upload thread's error in a RuntimeError; look down the cause chain.
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(seen, requests.HTTPError) and response is not None:
            status = response.status_code
            if status != 429 and status < 500:
                return None
            after = _retry_after(response.headers.get("Retry-After"))
            return min(after, options.max_backoff_s) if after is not None else backoff
        if isinstance(seen, (requests.ConnectionError, requests.Timeout)):
            return backoff
        seen = seen.__cause__
    return None


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: a number or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time()) if when else None


def _reason(exc: BaseException) -> str:
    seen: BaseException | None = exc
    while seen is not None:
        # A requests.Response is falsy for error statuses: compare with None, never rely on truthiness.
        if getattr(seen, "response", None) is not None:
            return f"HTTP {seen.response.status_code}"  # type: ignore[attr-defined]
        seen = seen.__cause__
    return type(exc).__name__


def _candidate(rows: list[dict[str, Any]], tolerances: dict[str, float]) -> Candidate:
    job = rows[0]
    return Candidate(
        run_id=job["run_id"],
        job_key=job["job_key"],
        source=job["source"],
        revision=job["revision"],
        resolved_revision=job["resolved_revision"],
        task=job["task"],
        model_type=job["model_type"],
        exporter=job["exporter"],
        opset=job["opset"],
        job_status=job["job_status"],
        artifacts_dir=job["artifacts_dir"],
        versions=_as_dict(job["versions"]),
        finished_at=job["finished_at"].isoformat() if job["finished_at"] else None,
        variants=tuple(
            VariantRow(
                variant=r["variant"],
                status=r["status"],
                file=r["file"],
                size_bytes=r["size_bytes"],
                max_abs=r["max_abs"],
                min_cosine=r["min_cosine"],
                ort_p50_ms=r["ort_p50_ms"],
                torch_p50_ms=r["torch_p50_ms"],
                speedup=r["speedup"],
            )
            for r in sorted(rows, key=lambda r: VARIANTS.index(r["variant"]) if r["variant"] in VARIANTS else 99)
            if r["variant"] is not None
        ),
        tolerances=tolerances,
    )


def _tolerances(settings_json: str | None) -> dict[str, float]:
    """max_abs per variant from the run's recorded settings, when it recorded them."""
    try:
        tol = json.loads(settings_json or "{}").get("tolerances") or {}
        return {v: float(t["max_abs"]) for v, t in tol.items() if isinstance(t, dict) and "max_abs" in t}
    except (ValueError, TypeError, AttributeError):
        return {}


def _as_dict(value: Any) -> dict[str, str]:
    """A DuckDB MAP as a dict, whichever shape the driver returns it in."""
    if isinstance(value, dict) and set(value) == {"key", "value"} and isinstance(value["key"], list):
        return dict(zip(value["key"], value["value"]))
    return dict(value or {})


def _variant_of(filename: str) -> str | None:
    """fp32 / fp16 / int8 from the transformers.js file naming (``*_fp16.onnx``, ``*_quantized.onnx``)."""
    suffixes = {v: f.removeprefix("model").removesuffix(".onnx") for v, f in VARIANT_FILES.items()}
    stem = filename.removesuffix(".onnx")
    for variant, suffix in sorted(suffixes.items(), key=lambda kv: -len(kv[1])):
        if stem.endswith(suffix):
            return variant
    return None


def _external_data(graph: Path) -> list[Path]:
    """The external data files an ONNX graph references (read from the graph, not guessed)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    names = {
        entry.value
        for tensor in _tensors(model.graph)
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    }
    return [graph.parent / n for n in sorted(names)]


def _tensors(graph: Any) -> Iterator[Any]:
    """Initializers and constant tensors of a graph and of its subgraphs (If / Loop / Scan bodies)."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _tensors(sub)


def _check_template(template: str) -> None:
    try:
        template.format(namespace="n", name="m", model_type="t", exporter="e", opset=1)
    except (KeyError, IndexError, ValueError) as exc:
        raise UsageError(f"bad --repo-template {template!r}: {exc}") from exc


def _mb(n: int | None) -> str:
    return f"{n / 1e6:.2f} MB" if n is not None else "-"


def _sci(x: float | None) -> str:
    return f"{x:.2e}" if x is not None else "-"


def _fixed(x: float | None, digits: int, unit: str = "") -> str:
    return f"{x:.{digits}f}{unit}" if x is not None else "-"

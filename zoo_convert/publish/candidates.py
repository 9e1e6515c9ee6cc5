"""What publishing reads from the results DB: one :class:`Candidate` per converted model."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..records import PASSED, VARIANTS
from ..store import ResultStore
from ..store import queries


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
    ort_runs: int | None = None
    ort_spread: float | None = None
    torch_runs: int | None = None
    torch_spread: float | None = None
    bench_threads: int | None = None
    bench_shape: str | None = None
    bench_cpu: str | None = None
    bench_load: float | None = None
    bench_noisy: bool | None = None
    bench_note: str | None = None


@dataclass(frozen=True)
class Candidate:
    """One converted model of a run, everything publishing needs from the results DB.

    Attributes:
        run_id / job_key: where it was recorded.
        source / revision / resolved_revision: the checkpoint it came from.
        task / model_type / exporter / opset: how it was converted.
        library: the checkpoint's library as the pipeline read it (transformers, timm, ...).
        tags: the manifest row's tags.
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
    library: str | None = None
    tags: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.job_status == PASSED


def load_candidates(store: ResultStore, run_id: str, job_keys: Iterable[str] | None = None) -> list[Candidate]:
    """Every job of a run (or those keys) with its variants, in the order the run recorded them."""
    rows = queries.job_results(store, run_id, None if job_keys is None else list(job_keys))
    tolerances = _tolerances(queries.run_settings(store, run_id))
    jobs: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        jobs.setdefault(r["job_key"], []).append(r)
    return [_candidate(job_rows, tolerances) for job_rows in jobs.values()]


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
        versions=job["versions"],
        finished_at=job["finished_at"],
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
                # A DB written before migration 8 has no latency conditions: its figures are shown without them.
                **{name: r.get(name) for name in _CONDITIONS},
            )
            for r in sorted(rows, key=lambda r: VARIANTS.index(r["variant"]) if r["variant"] in VARIANTS else 99)
            if r["variant"] is not None
        ),
        tolerances=tolerances,
        library=job.get("library"),
        tags=tuple(job.get("tags") or ()),
    )


_CONDITIONS = (
    "ort_runs",
    "ort_spread",
    "torch_runs",
    "torch_spread",
    "bench_threads",
    "bench_shape",
    "bench_cpu",
    "bench_load",
    "bench_noisy",
    "bench_note",
)


def _tolerances(settings: dict[str, Any]) -> dict[str, float]:
    """max_abs per variant from the run's recorded settings, when it recorded them."""
    tol = settings.get("tolerances")
    if not isinstance(tol, dict):
        return {}
    try:
        return {v: float(t["max_abs"]) for v, t in tol.items() if isinstance(t, dict) and "max_abs" in t}
    except (ValueError, TypeError):
        return {}

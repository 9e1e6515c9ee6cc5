"""What publishing reads from the results DB: one :class:`Candidate` per converted model."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from ..records import PASSED, VARIANTS, TargetResult, VariantResult
from ..store import ResultStore
from ..store import queries
from ..targets import names as target_names


# A variant as the results DB recorded it: the record itself (its outputs and optimizer details not read).
VariantRow = VariantResult


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
        targets: the job's deployment-target rows (one per variant and target, ``target_results``); empty for
            a run recorded before the targets (or with none chosen).
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
    targets: tuple[TargetResult, ...] = ()

    @property
    def passed(self) -> bool:
        return self.job_status == PASSED

    def passed_on(self, target: str) -> tuple[str, ...]:
        """The variants that passed on ``target`` (its recorded rows), in the record's order."""
        return tuple(t.variant for t in self.targets if t.target == target and t.status == PASSED)


def load_candidates(store: ResultStore, run_id: str, job_keys: Iterable[str] | None = None) -> list[Candidate]:
    """Every job of a run (or those keys) with its variants, in the order the run recorded them."""
    rows = queries.job_results(store, run_id, None if job_keys is None else list(job_keys))
    tolerances = _tolerances(queries.run_settings(store, run_id))
    jobs: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        jobs.setdefault(r["job_key"], []).append(r)
    on_targets: dict[str, list[TargetResult]] = {}
    for t in queries.job_targets(store, run_id, None if job_keys is None else list(jobs)):
        on_targets.setdefault(t.pop("job_key"), []).append(_target(t))
    return [_candidate(job_rows, tolerances, on_targets.get(key, [])) for key, job_rows in jobs.items()]


def _target(row: dict[str, Any]) -> TargetResult:
    """A target_results row as its record (the per-output checks are not stored)."""
    return TargetResult(target=row["target"], variant=row["variant"], status=row["status"],
                        version=row["target_version"], message=row["message"], max_abs=row["max_abs"],
                        min_cosine=row["min_cosine"], latency_ms=row["latency_ms"], providers=row["providers"],
                        seconds=row["seconds"], graph=row.get("graph"))  # fmt: skip


def _candidate(rows: list[dict[str, Any]], tolerances: dict[str, float], targets: list[TargetResult]) -> Candidate:
    job = rows[0]
    order = {v: i for i, v in enumerate(VARIANTS)}
    registered = {t: i for i, t in enumerate(target_names())}
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
            # A DB written before a column existed (the latency conditions: migration 8) gives None for it.
            VariantResult(**_columns(r))
            for r in sorted(rows, key=lambda r: VARIANTS.index(r["variant"]) if r["variant"] in VARIANTS else 99)
            if r["variant"] is not None
        ),
        tolerances=tolerances,
        library=job.get("library"),
        tags=tuple(job.get("tags") or ()),
        targets=tuple(sorted(targets, key=lambda t: (order.get(t.variant, 99), registered.get(t.target, 99), t.target))),
    )


# The VariantResult fields read back from results columns of the same name.
_COLUMNS = tuple(f.name for f in fields(VariantResult) if f.name not in ("optimizer", "outputs"))


def _columns(row: dict[str, Any]) -> dict[str, Any]:
    return {name: row.get(name) for name in _COLUMNS}


def _tolerances(settings: dict[str, Any]) -> dict[str, float]:
    """max_abs per variant from the run's recorded settings, when it recorded them."""
    tol = settings.get("tolerances")
    if not isinstance(tol, dict):
        return {}
    try:
        return {v: float(t["max_abs"]) for v, t in tol.items() if isinstance(t, dict) and "max_abs" in t}
    except (ValueError, TypeError):
        return {}

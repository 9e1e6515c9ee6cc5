"""``ResultStore``: the one module that writes the compatibility database.

DuckDB lets one process hold a database file open for writing, and while it
does, no other process may open it at all, not even read-only. So the store
holds a connection only for the length of one call: the farm driver writes a
job's rows in one short transaction and lets go, and ``db status`` or the
dashboard can read between two writes. Opening retries while another process
holds the lock, up to ``lock_timeout_s``.

Every write is one transaction in DuckDB's write-ahead log, so a driver killed
mid-run (even SIGKILL) leaves a file that reopens with every committed job.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import fields
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

import duckdb
import pyarrow as pa

from ..errors import FailureKind, StoreError, UsageError
from ..records import FAILED, ConversionResult, VariantResult
from .schema import LATEST_VERSION, MIGRATIONS, SCHEMA_MIGRATIONS

# DuckDB 2 writes a storage format no DuckDB 1.x can open. A new file is created in the
# v1.0.0 format instead, which every DuckDB since 1.0 reads; later writes keep it.
STORAGE_VERSION = "v1.0.0"

JOB_STAGES = ("fetch", "export", "check", "optimize")
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,99}")
VARIANT_STAGES = ("verify", "benchmark")


class ResultStore:
    """The results database: runs, per-variant results, verification numbers, op census."""

    def __init__(self, path: str | Path, *, read_only: bool = False, lock_timeout_s: float = 60.0) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self.lock_timeout_s = lock_timeout_s
        if read_only and not self.path.exists():
            raise StoreError(f"no results database at {self.path}")
        if not read_only:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a --db under a file, a read-only file system
                raise StoreError(f"{self.path}: cannot make its folder: {exc.strerror or exc}") from exc
        # The schema version found: a writer brings it up to LATEST_VERSION (``db migrate`` says from what).
        self.found_version = LATEST_VERSION
        with self.connect() as con:
            if read_only:
                _check_version(con, self.path)
            else:
                self.found_version = _migrate(con, self.path)

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Nothing stays open between calls; kept so callers can use the store as a context manager."""

    @contextlib.contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection for the length of a ``with`` block (read-only for a read-only store)."""
        con = _open(self.path, self.read_only, self.lock_timeout_s)
        try:
            yield con
        except duckdb.Error as exc:
            if not _unreadable(exc):
                raise
            raise StoreError(_unreadable_message(self.path, exc)) from exc
        finally:
            con.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self.read_only:
            raise StoreError(f"{self.path} was opened read-only")
        with self.connect() as con:
            con.begin()
            try:
                yield con
            except BaseException:
                con.rollback()
                raise
            con.commit()

    def start_run(
        self,
        run_id: str,
        *,
        manifest: str,
        manifest_hash: str,
        versions: dict[str, str],
        resources: dict[str, float],
        settings: dict[str, object],
        name: str | None = None,
    ) -> None:
        """Register a run before its first result; a run id is used once, and so is a name."""
        with self._transaction() as con:
            if con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone():
                raise StoreError(f"run {run_id!r} already exists")
            if name is not None:
                _check_run_name(con, name)
            (seq,) = _one(con, "SELECT coalesce(max(run_seq), 0) + 1 FROM runs")
            con.execute(
                "INSERT INTO runs (run_id, run_seq, manifest, manifest_hash, versions, resources, settings,"
                " started_at, status, name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', ?)",
                [run_id, seq, manifest, manifest_hash, _map(versions), _json(resources), _json(settings), _utcnow(),
                 name],
            )

    def check_run_name(self, name: str) -> None:
        """Raise UsageError unless ``name`` is a well-formed name no run uses yet (as a name or an id)."""
        with self.connect() as con:
            _check_run_name(con, name)

    def find_run(self, ref: str) -> tuple[str, int] | None:
        """The (run id, run seq) that ``ref`` names, by run name or run id; None when no run matches."""
        with self.connect() as con:
            row = con.execute(
                "SELECT run_id, run_seq FROM runs WHERE name = $ref OR run_id = $ref ORDER BY name = $ref DESC LIMIT 1",
                {"ref": ref},
            ).fetchone()
        return (row[0], row[1]) if row else None

    def abandon_runs(self) -> list[str]:
        """Mark every run still ``running`` as ``abandoned`` and return their ids.

        Only for the holder of the run lock (store/lock.py): no other run is live then, so
        such a run's driver was killed before it could say how the run ended.
        """
        with self._transaction() as con:
            rows = con.execute("UPDATE runs SET status = 'abandoned' WHERE status = 'running' RETURNING run_id").fetchall()
        return [r for (r,) in rows]

    def record(self, run_id: str, job_key: str, result: ConversionResult) -> None:
        """Write one job's result rows, verification rows and op census in one transaction."""
        self.record_many(run_id, [(job_key, result)])

    def record_many(self, run_id: str, jobs: list[tuple[str, ConversionResult]]) -> None:
        """Write several jobs in one transaction: all of them or none.

        Opening the file dominates a small write, so the farm driver records every
        result that is ready at once in one go.
        """
        if not jobs:
            return
        keys = [key for key, _ in jobs]
        if len(set(keys)) != len(keys):
            raise StoreError(f"a job is given twice in one batch for run {run_id!r}")
        with self._transaction() as con:
            if not con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone():
                raise StoreError(f"unknown run {run_id!r}; call start_run first")
            dup = con.execute(
                "SELECT job_key FROM results WHERE run_id = ? AND list_contains(?, job_key) LIMIT 1", [run_id, keys]
            ).fetchone()
            if dup:
                raise StoreError(f"job {dup[0]!r} is already recorded in run {run_id!r}")
            (seq,) = _one(con, "SELECT coalesce(max(job_seq), 0) FROM results")
            rows: list[dict[str, object]] = []
            checks: list[dict[str, object]] = []
            census: list[dict[str, object]] = []
            on_targets: list[dict[str, object]] = []
            # earlier jobs of this batch are predecessors too; keyed by (source, revision, exporter, requested opset)
            latest = _latest_seqs(con, {(r.source, r.revision, r.exporter, r.opset_requested) for _, r in jobs})
            for job_key, result in jobs:
                seq += 1
                model = (result.source, result.revision, result.exporter, result.opset_requested)
                previous = latest.get(model)
                latest[model] = seq
                for row in result_rows(result, run_id=run_id, job_key=job_key, job_seq=seq, recorded_at=_utcnow()):
                    rows.append({**row, "previous_job_seq": previous})
                checks += verification_rows(result, run_id=run_id, job_key=job_key)
                on_targets += target_rows(result, run_id=run_id, job_key=job_key)
                census += [{"run_id": run_id, "job_key": job_key, "op": op, "n": n} for op, n in result.op_census.items()]
            _insert(con, "results", rows)
            _insert(con, "verification", checks)
            _insert(con, "op_census", census)
            _insert(con, "target_results", on_targets)

    def finish_run(self, run_id: str, *, status: str = "completed") -> None:
        """Stamp the run's end time, final status and job counts."""
        with self._transaction() as con:
            counts = _one(
                con,
                "SELECT count(DISTINCT job_key),"
                " count(DISTINCT job_key) FILTER (WHERE job_status = 'passed'),"
                # an inconclusive job is neither: n_jobs - n_passed - n_failed of them
                " count(DISTINCT job_key) FILTER (WHERE job_status NOT IN ('passed', 'inconclusive'))"
                " FROM results WHERE run_id = ?",
                [run_id],
            )
            updated = con.execute(
                "UPDATE runs SET finished_at = ?, status = ?, n_jobs = ?, n_passed = ?, n_failed = ?"
                " WHERE run_id = ? RETURNING run_id",
                [_utcnow(), status, *counts, run_id],
            ).fetchall()
            if not updated:
                raise StoreError(f"unknown run {run_id!r}")

    def record_publication(self, row: dict[str, object]) -> None:
        """Append one publish outcome (``publish.Publication.to_row()``) to ``publications``."""
        self.record_publications([row])

    def record_publications(self, rows: list[dict[str, object]]) -> None:
        """Append several publish outcomes in one transaction, their timestamps in the order given."""
        now = _utcnow()
        with self._transaction() as con:
            _insert(con, "publications", [{**row, "published_at": now + timedelta(microseconds=i)} for i, row in enumerate(rows)])

    def terminal_keys(self, *, include_failed: bool = True) -> set[str]:
        """Job keys with a recorded result in any run; without failed ones, keys whose latest result passed.

        A job whose latest result has a kind that is not terminal (a full disk, no GPU: the
        machine's fault) is left out, so the next run redoes it. An inconclusive result is not a
        failure to retry: the same checkpoint, settings and toolchain (what the key is made of)
        give the same reference again, so only ``--force`` redoes it.
        """
        redo = [k.value for k in FailureKind if not k.terminal]
        with self.connect() as con:
            rows = con.execute(
                "WITH r AS (SELECT job_key, job_seq, job_status,"
                " list_contains(?, coalesce(failure_kind, '')) AS redo FROM results)"
                " SELECT job_key FROM r GROUP BY job_key"
                # the latest job's rows, one of them not terminal first: its redo decides
                " HAVING (? OR arg_max(job_status, job_seq) IN ('passed', 'inconclusive'))"
                " AND NOT arg_max(redo, job_seq * 2 + redo::INT)",
                [redo, include_failed],
            ).fetchall()
        return {k for (k,) in rows}

    def latest_keys(self) -> dict[tuple[str, str | None, str, int | None], tuple[str, str | None]]:
        """Each model's latest job (its key, and the checkpoint version it found), keyed as ``latest_results``
        partitions: (source, revision, exporter, requested opset); invalid manifest rows are no job of a model."""
        with self.connect() as con:
            rows = con.execute(
                "SELECT source, revision, exporter, opset_requested, arg_max(job_key, job_seq),"
                " arg_max(coalesce(resolved_revision, ''), job_seq) FROM results"  # arg_max skips a NULL
                " WHERE failure_kind IS DISTINCT FROM 'manifest_error' GROUP BY ALL"
            ).fetchall()
        return {(source, revision, exporter, opset): (key, found or None) for source, revision, exporter, opset, key, found in rows}

    def timeouts(self) -> dict[str, float | None]:
        """Job keys whose latest result is a ``timeout``, with the hard timeout it ran under (None: unknown).

        Rows written before ``results.timeout_s`` existed fall back to their run's ``--timeout``.
        """
        with self.connect() as con:
            rows = con.execute(
                "SELECT job_key, arg_max(coalesce(r.timeout_s, TRY_CAST(runs.settings ->> '$.timeout_s' AS DOUBLE)), job_seq)"
                " FROM results r JOIN runs USING (run_id) GROUP BY job_key"
                " HAVING arg_max(failure_kind, job_seq) = 'timeout'"
            ).fetchall()
        return dict(rows)


    def last_durations(self) -> dict[tuple[str, str | None, int | None], float]:
        """Seconds the latest job took per (source, exporter, requested opset): what the planner expects next time."""
        with self.connect() as con:
            rows = con.execute(
                "SELECT source, exporter, opset_requested, arg_max(epoch(finished_at) - epoch(started_at), job_seq)"
                " FROM results WHERE started_at IS NOT NULL AND finished_at IS NOT NULL GROUP BY ALL"
            ).fetchall()
        return {(src, exporter, opset): float(seconds) for src, exporter, opset, seconds in rows if seconds is not None}


def result_rows(
    result: ConversionResult, *, run_id: str, job_key: str, job_seq: int, recorded_at: datetime
) -> list[dict[str, object]]:
    """The ``results`` rows of one job: one per variant, or one with variant NULL when none exists."""
    job_seconds = {name: _stage_seconds(result, name) for name in JOB_STAGES}
    peaks = [s.peak_mem_mb for s in result.stages if s.peak_mem_mb is not None]
    job: dict[str, object] = {
        "run_id": run_id,
        "job_key": job_key,
        "job_seq": job_seq,
        "recorded_at": recorded_at,
        "source": result.source,
        "revision": result.revision,
        "resolved_revision": result.resolved_revision,
        "task": result.task,
        "model_type": result.model_type,
        "library": result.library,
        "exporter": result.exporter,
        "exporter_used": result.exporter_used,
        "exporter_reason": result.exporter_reason,
        "opset_requested": result.opset_requested,
        "opset": result.opset,
        "ir_version": result.ir_version,
        "node_count": result.node_count,
        "job_status": result.status,
        "traceback": result.traceback,
        **{f"{name}_s": s for name, s in job_seconds.items()},
        "peak_mem_mb": max(peaks) if peaks else None,
        "attempts": result.attempts,
        "timeout_s": result.timeout_s,
        "node": result.node,
        "manifest_row": result.row,
        "tags": list(result.tags),
        "versions": _map(result.versions),
        "artifacts_dir": result.artifacts_dir,
        "started_at": _timestamp(result.started_at),
        "finished_at": _timestamp(result.finished_at),
    }
    if not result.variants:
        return [
            {
                **job,
                "variant": None,
                "status": result.status,
                "failure_kind": result.failure_kind,
                "stage": result.stage,
                "message": result.message,
            }
        ]
    return [{**job, **_variant_columns(result, v)} for v in result.variants]


def verification_rows(result: ConversionResult, *, run_id: str, job_key: str) -> list[dict[str, object]]:
    """The ``verification`` rows of one job: one per variant, output and input shape."""
    return [
        {
            "run_id": run_id,
            "job_key": job_key,
            "variant": v.variant,
            "output": o.output,
            "shape": o.shape,
            "max_abs": o.max_abs,
            "max_rel": o.max_rel,
            "mean_abs": o.mean_abs,
            "cosine": o.cosine,
            "n_nan": o.nan,
            "n_inf": o.inf,
            "passed": o.passed,
            "bound_used": o.bound_used,
        }
        for v in result.variants
        for o in v.outputs
    ]


def target_rows(result: ConversionResult, *, run_id: str, job_key: str) -> list[dict[str, object]]:
    """The ``target_results`` rows of one job: one per variant and deployment target."""
    return [
        {
            "run_id": run_id,
            "job_key": job_key,
            "variant": t.variant,
            "target": t.target,
            "target_version": t.version,
            "status": t.status,
            "message": t.message,
            "max_abs": t.max_abs,
            "min_cosine": t.min_cosine,
            "latency_ms": t.latency_ms,
            "providers": t.providers,
            "seconds": t.seconds,
            "graph": t.graph,
        }
        for t in result.targets
    ]


# VariantResult's fields that are results columns of the same name and value: its file, size,
# error statistics and latency with their conditions. The others are decided below.
_VARIANT_AS_IS = tuple(
    f.name
    for f in fields(VariantResult)
    if f.name not in ("variant", "status", "failure_kind", "message", "traceback", "optimizer", "outputs")
)


def _variant_columns(result: ConversionResult, v: VariantResult) -> dict[str, object]:
    status, kind, stage, message = v.status, v.failure_kind, None, v.message
    if v.status == FAILED:
        stage = result.failed_stage(v)
    elif result.failure_kind and result.stage not in VARIANT_STAGES:
        # The job itself failed after this variant was made (a timeout, a crash): the cell did not make it.
        status, kind, stage, message = FAILED, result.failure_kind, result.stage, result.message
    return {
        "variant": v.variant,
        "status": status,
        "failure_kind": kind,
        "stage": stage,
        "message": message,
        # A variant that failed on its own, or whose timing hit a bug of ours, keeps its traceback
        # in its row; the others show the job's.
        "traceback": v.traceback if (v.status == FAILED or v.bench_note) and v.traceback else result.traceback,
        "verify_s": _verify_seconds(result, v.variant),
        # One benchmark times every variant of the job together: each row shows its seconds.
        "benchmark_s": _stage_seconds(result, "benchmark"),
        **{name: getattr(v, name) for name in _VARIANT_AS_IS},
        "optimizer": _json(v.optimizer),
    }


def _stage_seconds(result: ConversionResult, stage: str) -> float | None:
    """The job-level stage's seconds (a > 2 GB model's two benchmark stages summed)."""
    times = [s.seconds for s in result.stages if s.stage == stage and "variant" not in s.details]
    return sum(times) if times else None


def _verify_seconds(result: ConversionResult, variant: str) -> float | None:
    """What verifying ``variant`` cost: the job's PyTorch references (computed once, shared like
    the benchmark's seconds), ONNX Runtime's checks (run in the optimize child) and the judging."""
    parts = [s.seconds + s.details.get("checks_seconds", 0.0) for s in result.stages
             if s.stage == "verify" and s.details.get("variant") in (None, variant)]  # fmt: skip
    return round(sum(parts), 4) if parts else None


_Model = tuple[str, str | None, str, int | None]


def _latest_seqs(con: duckdb.DuckDBPyConnection, models: set[_Model]) -> dict[_Model, int]:
    """Each model's latest ``job_seq`` (source, revision, exporter, requested opset), in one query for a whole batch:
    one query per job made recording 50,000 invalid rows take minutes."""
    batch = pa.table({name: [m[i] for m in models] for i, name in enumerate(("source", "revision", "exporter", "opset"))},
                     schema=pa.schema([("source", pa.string()), ("revision", pa.string()), ("exporter", pa.string()),
                                       ("opset", pa.int32())]))  # fmt: skip
    con.register("_batch_models", batch)
    try:
        found = con.execute(
            "SELECT b.source, b.revision, b.exporter, b.opset, max(r.job_seq) FROM _batch_models b JOIN results r"
            " ON r.source = b.source AND r.revision IS NOT DISTINCT FROM b.revision"
            " AND r.exporter IS NOT DISTINCT FROM b.exporter AND r.opset_requested IS NOT DISTINCT FROM b.opset"
            " GROUP BY ALL"
        ).fetchall()
    finally:
        con.unregister("_batch_models")
    return {(s, rev, e, o): seq for s, rev, e, o, seq in found}


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, object]]) -> None:
    """Insert rows as one Arrow table typed as the table's columns (``executemany`` took ~5 ms a row)."""
    if not rows:
        return
    # Every row's columns: a job that failed before any variant has fewer than one with variants.
    columns = list(dict.fromkeys(c for row in rows for c in row))
    names = ", ".join(columns)
    schema = con.sql(f"SELECT {names} FROM {table} LIMIT 0").to_arrow_table().schema
    maps = [f.name for f in schema if pa.types.is_map(f.type)]
    values = [{c: row.get(c) for c in columns} for row in rows]
    for row in values:
        for name in maps:  # _map's {'key': [...], 'value': [...]}, as DuckDB's parameters read a MAP
            if isinstance(m := row[name], dict):
                row[name] = list(zip(m["key"], m["value"]))
    con.register("_batch_rows", pa.Table.from_pylist(values, schema=schema))
    try:
        con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM _batch_rows")
    finally:
        con.unregister("_batch_rows")


def _unreadable(exc: duckdb.Error) -> bool:
    """DuckDB says the file itself is bad (truncated, a checksum mismatch), not the SQL sent to it."""
    return type(exc) is duckdb.Error or isinstance(
        exc, (duckdb.IOException, duckdb.SerializationException, duckdb.InternalException, duckdb.FatalException)
    )


def _unreadable_message(path: Path, exc: duckdb.Error) -> str:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"cannot use {path}: {first} (a corrupt or truncated file: restore it from a backup)"


def _open(path: Path, read_only: bool, lock_timeout_s: float) -> duckdb.DuckDBPyConnection:
    """Open the file, waiting while another process holds DuckDB's file lock; a new file gets ``STORAGE_VERSION``."""
    deadline = time.monotonic() + lock_timeout_s
    delay = 0.02
    while True:
        config: dict[str, str | bool | int | float | list[str]] = (
            {} if read_only or path.exists() else {"storage_compatibility_version": STORAGE_VERSION}
        )
        try:
            return duckdb.connect(str(path), read_only=read_only, config=config)
        except duckdb.Error as exc:
            if not isinstance(exc, duckdb.IOException) or "lock" not in str(exc).lower():
                raise StoreError(f"cannot open {path}: {exc}") from exc
            if time.monotonic() >= deadline:
                raise StoreError(
                    f"{path} is held by another process for longer than {lock_timeout_s:.0f} s: {exc}"
                ) from exc
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _check_run_name(con: duckdb.DuckDBPyConnection, name: str) -> None:
    if not RUN_NAME.fullmatch(name):
        raise UsageError(f"run name {name!r}: use up to 100 letters, digits and . _ : + - (starting with a letter or digit)")
    try:
        datetime.fromisoformat(name)
    except ValueError:
        pass
    else:  # --since reads a date as a date
        raise UsageError(f"run name {name!r} reads as a date; add a word (nightly-{name})")
    taken = con.execute("SELECT run_id FROM runs WHERE name = $n OR run_id = $n", {"n": name}).fetchone()
    if taken:
        raise UsageError(f"run name {name!r} is taken by run {taken[0]}; each run needs its own name")


def _migrate(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    """Apply the migrations the database lacks; the newest it had before (0: a new database).

    A DuckDB file that holds tables or views but no ``schema_migrations`` is someone else's
    database (a ``--db`` pointed at the wrong file): refused, never given our tables.
    """
    names = [n for (n,) in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database() ORDER BY 1"
    ).fetchall()]  # fmt: skip
    if names and "schema_migrations" not in names:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise StoreError(f"{path} is not a zoo_convert results database (it holds {shown}); nothing was written to it: "
                         "name a new file or a results database")
    con.execute(SCHEMA_MIGRATIONS)
    applied = {v for (v,) in con.execute("SELECT version FROM schema_migrations").fetchall()}
    found = max(applied, default=0)
    for m in MIGRATIONS:
        if m.version in applied:
            continue
        con.begin()
        try:
            con.execute(m.sql)
            con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", [m.version, m.name])
        except BaseException:
            con.rollback()
            raise
        con.commit()
    return found


def _one(con: duckdb.DuckDBPyConnection, sql: str, params: object = None) -> tuple[Any, ...]:
    """The row of a query that always answers one (an aggregate without GROUP BY)."""
    rows = con.execute(sql, params).fetchall()  # all of it: DuckDB refuses other work while a result is unread
    row = rows[0] if rows else None
    if row is None:
        raise StoreError(f"no row where one is always expected: {sql}")
    return row


def _check_version(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    try:
        (version,) = _one(con, "SELECT coalesce(max(version), 0) FROM schema_migrations")
    except duckdb.CatalogException as exc:
        raise StoreError(f"{path} is not a zoo_convert results database") from exc
    if version < LATEST_VERSION:
        raise StoreError(f"{path} has schema version {version} < {LATEST_VERSION}, this zoo_convert's: "
                         f"zoo-convert db migrate --db {path} (or the next run on it) migrates it")


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _timestamp(iso: str | None) -> datetime | None:
    """ISO-8601 text to a naive UTC timestamp (the DB stores UTC throughout)."""
    if not iso:
        return None
    dt = datetime.fromisoformat(iso)
    return dt.astimezone(timezone.utc).replace(tzinfo=None) if dt.tzinfo else dt


def _map(d: dict[str, str]) -> dict[str, list[str]]:
    """DuckDB's Python binding reads a {'key': [...], 'value': [...]} dict as a MAP."""
    return {"key": [str(k) for k in d], "value": [str(v) for v in d.values()]}


def _json(obj: object) -> str:
    """JSON text DuckDB accepts: non-finite floats (an int8 tolerance is inf) become strings."""
    return json.dumps(_finite(obj), default=_default, sort_keys=True)


def _finite(obj: object) -> object:
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_finite(v) for v in obj]
    if hasattr(obj, "__dataclass_fields__"):
        return _finite(obj.__dict__)
    return obj


def _default(o: object) -> object:
    if hasattr(o, "item"):  # numpy scalars
        return _finite(o.item())
    return str(o)

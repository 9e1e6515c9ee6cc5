"""Read-side helpers behind ``zoo-convert db``: status, regressions, ad-hoc SQL, Parquet export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import UsageError
from .db import ResultStore

EXPORTED = ("runs", "results", "verification", "op_census", "publications",
            "latest_results", "compat_matrix", "regressions", "failure_signatures")


def query(store: ResultStore, sql: str, params: list[Any] | None = None) -> tuple[list[str], list[tuple]]:
    """Run one SQL statement; returns column names and rows."""
    with store.connect() as con:
        try:
            cur = con.execute(sql, params or [])
        except Exception as exc:  # noqa: BLE001 - any DuckDB error is the user's SQL: bad usage, exit 2
            raise UsageError(f"query failed: {exc}") from exc
        if cur.description is None:
            return [], []
        return [d[0] for d in cur.description], cur.fetchall()


def status(store: ResultStore) -> dict[str, Any]:
    """The latest run at a glance: counts, failure kinds, regressions; empty when there is no run."""
    cols, rows = query(store, "SELECT * FROM runs ORDER BY run_seq DESC LIMIT 1")
    if not rows:
        return {}
    run = dict(zip(cols, rows[0]))
    _, counts = query(
        store,
        "SELECT count(DISTINCT job_key), count(DISTINCT job_key) FILTER (WHERE job_status = 'passed'),"
        " count(*) FROM results WHERE run_id = ?",
        [run["run_id"]],
    )
    _, kinds = query(
        store,
        "SELECT failure_kind, count(DISTINCT job_key) AS n FROM results"
        " WHERE run_id = ? AND failure_kind IS NOT NULL GROUP BY ALL ORDER BY n DESC, failure_kind",
        [run["run_id"]],
    )
    _, regressed = query(store, "SELECT count(*) FROM regressions WHERE run_id = ?", [run["run_id"]])
    jobs, passed, n_rows = counts[0]
    return {
        **{k: run[k] for k in ("run_id", "status", "manifest", "started_at", "finished_at")},
        "jobs": jobs,
        "passed": passed,
        "failed": jobs - passed,
        "result_rows": n_rows,
        "failure_kinds": dict(kinds),
        "regressions": regressed[0][0],
        "runs": query(store, "SELECT count(*) FROM runs")[1][0][0],
    }


def regressions(store: ResultStore, since: str | None = None) -> tuple[list[str], list[tuple]]:
    """Regressions in the runs after ``since``, or in the latest run when it is None."""
    if since is None:
        where, params = "run_seq = (SELECT max(run_seq) FROM runs)", []
    else:
        if not query(store, "SELECT 1 FROM runs WHERE run_id = ?", [since])[1]:
            raise UsageError(f"unknown run {since!r}")
        where, params = "run_seq > (SELECT run_seq FROM runs WHERE run_id = ?)", [since]
    return query(
        store,
        "SELECT run_id, previous_run_id, regression, source, exporter, opset, variant,"
        " previous_max_abs, max_abs, previous_ort_p50_ms, ort_p50_ms, failure_kind, message"
        f" FROM regressions WHERE {where} ORDER BY run_seq, source, variant, regression",
        params,
    )


def export_parquet(store: ResultStore, out_dir: str | Path) -> list[Path]:
    """Write every table and view as ``<name>.parquet`` under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with store.connect() as con:
        for name in EXPORTED:
            path = out / f"{name}.parquet"
            con.execute(f"COPY (SELECT * FROM {name}) TO '{_sql_string(path)}' (FORMAT parquet)")
            written.append(path)
    return written


def format_table(columns: list[str], rows: list[tuple], *, max_width: int = 60) -> str:
    """Rows as an aligned plain-text table, each cell cut at ``max_width`` characters."""
    cells = [[_cell(v, max_width) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def _cell(value: Any, max_width: int) -> str:
    text = "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
    text = " ".join(text.split())
    return text if len(text) <= max_width else text[: max_width - 1] + "…"


def _sql_string(path: Path) -> str:
    return str(path).replace("'", "''")

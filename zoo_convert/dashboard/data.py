"""The dashboard's numbers: one named DuckDB query per panel, each bounded in size.

Every query aggregates or caps its rows, so the page stays small for a
database of millions of results: the per-model table holds at most
``MODEL_CAP`` models (failures first) and each model's drill-down is loaded
from a separate chunk file only when it is opened.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import duckdb

MODEL_CAP = 2000
TOP_SIGNATURES = 25
MAX_REGRESSIONS = 500

Con = duckdb.DuckDBPyConnection

# The per-model table's unit: one model identity's latest job; `id` orders failures first.
_MODELS = f"""
CREATE TEMP TABLE dash_models AS
WITH jobs AS (
    SELECT job_seq, any_value(run_id) AS run_id, any_value(job_key) AS job_key,
        any_value(source) AS source, any_value(revision) AS revision, any_value(model_type) AS model_type,
        any_value(task) AS task, any_value(exporter) AS exporter,
        any_value(coalesce(opset, opset_requested)) AS opset, any_value(job_status) AS status,
        any_value(attempts) AS attempts, any_value(node) AS node,
        any_value(peak_mem_mb) AS peak_mem_mb,
        min(failure_kind) FILTER (WHERE variant = 'fp32' OR variant IS NULL) AS fp32_kind,
        min(failure_kind) AS any_kind,
        min(message) FILTER (WHERE variant = 'fp32' OR variant IS NULL) AS fp32_message,
        min(message) AS any_message,
        map_from_entries(list(struct_pack(k := variant, v := status)) FILTER (WHERE variant IS NOT NULL)) AS variants,
        any_value(max_abs) FILTER (WHERE variant = 'fp32') AS max_abs,
        any_value(speedup) FILTER (WHERE variant = 'fp32') AS speedup,
        any_value(ort_p50_ms) FILTER (WHERE variant = 'fp32') AS ort_p50_ms
    FROM latest_results
    WHERE failure_kind IS DISTINCT FROM 'manifest_error'
    GROUP BY job_seq
)
SELECT row_number() OVER (ORDER BY status = 'passed', source, exporter, opset) - 1 AS id,
    * EXCLUDE (fp32_kind, any_kind, fp32_message, any_message),
    coalesce(fp32_kind, any_kind) AS failure_kind,
    left(coalesce(fp32_message, any_message), 300) AS message
FROM jobs
ORDER BY id
LIMIT {MODEL_CAP};
"""

QUERIES: dict[str, str] = {
    "headline": """
        SELECT
            (SELECT count(*) FROM runs) AS runs,
            (SELECT max_by(run_id, run_seq) FROM runs) AS latest_run,
            (SELECT count(*) FROM results) AS result_rows,
            count(DISTINCT job_seq) AS models,
            count(DISTINCT job_seq) FILTER (WHERE job_status = 'passed') AS passed,
            median(speedup) FILTER (WHERE variant = 'fp32' AND status = 'passed') AS median_speedup
        FROM latest_results
        WHERE failure_kind IS DISTINCT FROM 'manifest_error'
    """,
    "matrix": """
        SELECT model_type, opset, variant, models, passed, pass_rate, failure_kinds
        FROM compat_matrix ORDER BY model_type, opset, variant
    """,
    "failure_kinds": """
        SELECT failure_kind, any_value(stage) AS stage, count(DISTINCT job_seq) AS n
        FROM latest_results WHERE failure_kind IS NOT NULL
        GROUP BY failure_kind ORDER BY n DESC
    """,
    "signatures": f"""
        SELECT failure_kind, stage, signature, n, models, sample_models[1:5] AS sample_models, left(example, 400) AS example
        FROM failure_signatures ORDER BY n DESC, signature LIMIT {TOP_SIGNATURES}
    """,
    "regressions": f"""
        SELECT run_id, previous_run_id, regression, source, exporter, opset, variant,
            previous_max_abs, max_abs, previous_ort_p50_ms, ort_p50_ms, failure_kind, left(message, 300) AS message
        FROM regressions WHERE run_seq = $latest_seq
        ORDER BY regression, source, variant LIMIT {MAX_REGRESSIONS}
    """,
    # Finished runs carry their counts (ResultStore.finish_run); only running or killed ones are counted here.
    "runs": """
        SELECT runs.run_id, runs.run_seq, strftime(runs.started_at, '%Y-%m-%d %H:%M') AS started_at, runs.status,
            coalesce(runs.n_jobs, live.jobs, 0) AS jobs, coalesce(runs.n_passed, live.passed, 0) AS passed
        FROM runs LEFT JOIN (
            SELECT run_id, count(DISTINCT job_seq) AS jobs,
                count(DISTINCT job_seq) FILTER (WHERE job_status = 'passed') AS passed
            FROM results WHERE run_id IN (SELECT run_id FROM runs WHERE n_jobs IS NULL)
            GROUP BY run_id
        ) live USING (run_id)
        ORDER BY runs.run_seq
    """,
    # Histograms in log space: speedups spread around 1x, errors across decades.
    "speedup_hist": """
        SELECT variant, floor(log2(speedup) * 4) / 4 AS bin, count(*) AS n
        FROM latest_results WHERE status = 'passed' AND speedup > 0
        GROUP BY ALL ORDER BY variant, bin
    """,
    "error_hist": """
        SELECT variant, floor(log10(greatest(max_abs, 1e-12))) AS bin, count(*) AS n
        FROM latest_results WHERE max_abs IS NOT NULL AND isfinite(max_abs)
        GROUP BY ALL ORDER BY variant, bin
    """,
    "models": "SELECT * EXCLUDE (job_seq, job_key, run_id), run_id AS run FROM dash_models ORDER BY id",
    "model_count": """
        SELECT count(DISTINCT job_seq) FROM latest_results WHERE failure_kind IS DISTINCT FROM 'manifest_error'
    """,
}

DETAIL_QUERIES: dict[str, str] = {
    "detail_variants": """
        SELECT m.id, r.variant, r.status, r.failure_kind, r.stage, r.message, r.max_abs, r.max_rel, r.min_cosine,
            r.ort_p50_ms, r.ort_p90_ms, r.torch_p50_ms, r.torch_p90_ms, r.speedup, r.size_bytes,
            r.verify_s, r.benchmark_s, left(r.traceback, 4000) AS traceback
        FROM dash_models m JOIN results r USING (job_seq) ORDER BY m.id, r.variant
    """,
    "detail_outputs": """
        SELECT m.id, v.variant, v.output, v.shape, v.max_abs, v.max_rel, v.cosine, v.n_nan, v.n_inf, v.passed
        FROM dash_models m JOIN verification v USING (run_id, job_key) ORDER BY m.id, v.variant, v.output, v.shape
    """,
    "detail_census": """
        SELECT m.id, list(struct_pack(op := c.op, n := c.n) ORDER BY c.n DESC, c.op) AS ops
        FROM dash_models m JOIN op_census c USING (run_id, job_key) GROUP BY m.id ORDER BY m.id
    """,
    "detail_stages": """
        SELECT m.id, any_value(r.fetch_s) AS fetch_s, any_value(r.export_s) AS export_s,
            any_value(r.check_s) AS check_s, any_value(r.optimize_s) AS optimize_s,
            any_value(r.versions) AS versions, any_value(r.resolved_revision) AS resolved_revision
        FROM dash_models m JOIN results r USING (job_seq) GROUP BY m.id ORDER BY m.id
    """,
}


def collect(con: Con, timer: Callable[[str, float], None] | None = None) -> dict[str, Any]:
    """Run every panel query; ``timer(name, seconds)`` hears how long each took."""
    data: dict[str, Any] = {}
    _timed("models_table", lambda: con.execute(_MODELS), timer)
    # A literal run_seq lets DuckDB filter early; a scalar subquery there costs 50% more.
    (latest_seq,) = con.execute("SELECT coalesce(max(run_seq), 0) FROM runs").fetchall()[0]
    for name, sql in {**QUERIES, **DETAIL_QUERIES}.items():
        params = {"latest_seq": latest_seq} if "$latest_seq" in sql else None
        data[name] = _timed(name, lambda sql=sql, params=params: _records(con, sql, params), timer)
    data["headline"] = data["headline"][0]
    data["model_count"] = next(iter(data["model_count"][0].values()))
    data["model_cap"] = MODEL_CAP
    return data


def _timed(name: str, fn: Callable[[], Any], timer: Callable[[str, float], None] | None) -> Any:
    t0 = time.perf_counter()
    out = fn()
    if timer:
        timer(name, time.perf_counter() - t0)
    return out


def _records(con: Con, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params) if params else con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, row)) for row in cur.fetchall()]

"""The dashboard's numbers: one named DuckDB query per panel, each bounded in size.

Every query aggregates or caps its rows, so the page stays small for a
database of millions of results: the per-model table holds at most
``MODEL_CAP`` models (failures first) and each model's drill-down is loaded
from a separate chunk file only when it is opened.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import duckdb

from ..records import VARIANTS
from ..stages.benchmark import NOISY_CI
from ..store.queries import regression_rows
from ..targets import names as target_names

MODEL_CAP = 2000
TOP_SIGNATURES = 25
MAX_REGRESSIONS = 500

Con = duckdb.DuckDBPyConnection

# ONNX Runtime on the CPU that converted the model: the verdict (results), shown as the first target. The
# deployment targets' rows (compat_by_target) follow in the registry's order; their own `ort-cpu` rows
# (the 1-thread re-check from the saved reference) are db status's, not a second ort-cpu line here.
VERDICT_TARGET = "ort-cpu"
_TARGET_ORDER = f"list_position({[VERDICT_TARGET, *(n for n in target_names() if n != VERDICT_TARGET)]}, target)"
_VARIANT_ORDER = f"list_position({list(VARIANTS)}, variant)"

# The per-model table's unit: one model identity's latest job; `id` orders failures first, then partial ones.
# A model is passed (every variant verified), partial (converted, a variant failed), failed (not converted)
# or inconclusive (verified against a PyTorch reference that proves nothing).
_MODELS = f"""
CREATE TEMP TABLE dash_models AS
WITH jobs AS (
    SELECT job_seq, any_value(run_id) AS run_id, any_value(job_key) AS job_key,
        any_value(source) AS source, any_value(revision) AS revision, any_value(model_type) AS model_type,
        any_value(task) AS task, any_value(exporter) AS exporter, any_value(opset_requested) AS opset_requested,
        any_value(coalesce(opset, opset_requested)) AS opset,
        CASE WHEN any_value(job_status) = 'inconclusive' THEN 'inconclusive'
             WHEN any_value(job_status) <> 'passed' THEN 'failed'
             WHEN bool_or(status = 'failed') THEN 'partial' ELSE 'passed' END AS status,
        any_value(attempts) AS attempts, any_value(node) AS node,
        any_value(peak_mem_mb) AS peak_mem_mb,
        min(failure_kind) FILTER (WHERE variant = 'fp32' OR variant IS NULL) AS fp32_kind,
        min(failure_kind) AS any_kind,
        min(message) FILTER (WHERE variant = 'fp32' OR variant IS NULL) AS fp32_message,
        min(message) AS any_message,
        map_from_entries(list(struct_pack(k := variant, v := status)) FILTER (WHERE variant IS NOT NULL)) AS variants,
        any_value(max_abs) FILTER (WHERE variant = 'fp32') AS max_abs,
        -- a noisy latency says nothing of the speedup: the table leaves it blank, the drill-down says why
        any_value(speedup) FILTER (WHERE variant = 'fp32' AND NOT coalesce(bench_noisy, false)) AS speedup,
        any_value(ort_p50_ms) FILTER (WHERE variant = 'fp32') AS ort_p50_ms,
        -- shown as "noisy", never as a figure (as the speedup, the headline and the card leave it out)
        coalesce(any_value(bench_noisy) FILTER (WHERE variant = 'fp32'), false) AS ort_p50_noisy,
        list(variant ORDER BY variant) FILTER (WHERE status = 'failed') AS failed_variants
    FROM latest_results
    WHERE failure_kind IS DISTINCT FROM 'manifest_error'
    GROUP BY job_seq
)
SELECT row_number() OVER (ORDER BY status = 'passed', status = 'partial', source, exporter, opset) - 1 AS id,
    * EXCLUDE (fp32_kind, any_kind, fp32_message, any_message),
    coalesce(fp32_kind, any_kind) AS failure_kind,
    left(coalesce(fp32_message, any_message), 300) AS message
FROM jobs
ORDER BY id
LIMIT {MODEL_CAP};
"""

# The zoo after each run: every model's latest job up to that run, carried forward. A job replaces
# its model's previous one (results.previous_job_seq) from its run on, so the zoo changes at each run
# by the sum of (job - previous job); a running sum over the runs gives the state after each run
# without a model x run cross product. A manifest_error job counts as the model being absent, as in
# latest_results.
_ZOO_OVER_RUNS = """
WITH jobs AS (
    SELECT job_seq, any_value(run_id) AS run_id, any_value(previous_job_seq) AS previous_job_seq,
        bool_and(failure_kind IS DISTINCT FROM 'manifest_error')::INTEGER AS present,
        (any_value(job_status) = 'passed')::INTEGER AS converted,
        count(variant) AS variants, count(variant) FILTER (WHERE status = 'passed') AS verified
    FROM results
    GROUP BY job_seq
),
deltas AS (
    SELECT runs.run_seq AS seq, sum(j.present - coalesce(p.present, 0)) AS models,
        sum(j.converted - coalesce(p.converted, 0)) AS converted,
        sum(j.variants - coalesce(p.variants, 0)) AS variants, sum(j.verified - coalesce(p.verified, 0)) AS verified
    FROM jobs j JOIN runs USING (run_id) LEFT JOIN jobs p ON p.job_seq = j.previous_job_seq
    GROUP BY runs.run_seq
)
SELECT runs.run_id, coalesce(runs.name, strftime(runs.started_at, '%Y-%m-%d %H:%M')) AS label,
    strftime(runs.started_at, '%Y-%m-%d %H:%M') AS started_at, runs.status,
    sum(coalesce(d.models, 0)) OVER w AS models, sum(coalesce(d.converted, 0)) OVER w AS converted,
    sum(coalesce(d.variants, 0)) OVER w AS variants, sum(coalesce(d.verified, 0)) OVER w AS verified
FROM runs LEFT JOIN deltas d ON d.seq = runs.run_seq
WINDOW w AS (ORDER BY runs.run_seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
ORDER BY runs.run_seq
"""

QUERIES: dict[str, str] = {
    "headline": """
        SELECT
            (SELECT count(*) FROM runs) AS runs,
            (SELECT max_by(run_id, run_seq) FROM runs) AS latest_run,
            (SELECT max_by(name, run_seq) FROM runs) AS latest_name,
            (SELECT count(*) FROM results) AS result_rows,
            count(DISTINCT job_seq) AS models,
            count(DISTINCT job_seq) FILTER (WHERE job_status = 'passed') AS converted,
            count(DISTINCT job_seq) FILTER (WHERE job_status = 'passed' AND status = 'failed') AS partial,
            count(DISTINCT job_seq) FILTER (WHERE job_status = 'inconclusive') AS inconclusive,
            count(variant) AS variants,
            count(variant) FILTER (WHERE status = 'passed') AS variants_verified,
            median(speedup) FILTER (WHERE variant = 'fp32' AND status = 'passed' AND NOT coalesce(bench_noisy, false))
                AS median_speedup,
            -- how many models the median is taken over (one fp32 row each), and why the others are not in it
            count(speedup) FILTER (WHERE variant = 'fp32' AND status = 'passed' AND NOT coalesce(bench_noisy, false))
                AS speedup_n,
            count(speedup) FILTER (WHERE variant = 'fp32' AND status = 'passed' AND bench_noisy) AS speedup_noisy
        FROM latest_results
        WHERE failure_kind IS DISTINCT FROM 'manifest_error'
    """,
    # compat_matrix with the task beside the model type: one model type serves several tasks.
    "matrix": """
        SELECT coalesce(c.model_type, 'unknown') AS model_type, c.task, coalesce(c.opset, c.opset_requested) AS opset,
            c.variant, count(*) AS models, count(*) FILTER (WHERE c.status = 'passed') AS passed,
            count(*) FILTER (WHERE c.status = 'passed') / count(*) AS pass_rate,
            list_sort(list_distinct(list(c.failure_kind))) AS failure_kinds,
            count(*) FILTER (WHERE c.status = 'inconclusive') AS inconclusive
        FROM result_cells c SEMI JOIN latest_results l ON c.job_seq = l.job_seq
        GROUP BY ALL ORDER BY model_type, task, opset, variant
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
    "runs": _ZOO_OVER_RUNS,
    # Histograms in log space: speedups spread around 1x, errors across decades. A noisy latency
    # (too spread, or taken under load) says nothing of the speedup: left out of it and the headline.
    "speedup_hist": """
        SELECT variant, floor(log2(speedup) * 4) / 4 AS bin, count(*) AS n
        FROM latest_results WHERE status = 'passed' AND speedup > 0 AND NOT coalesce(bench_noisy, false)
        GROUP BY ALL ORDER BY variant, bin
    """,
    "error_hist": """
        SELECT variant, floor(log10(greatest(max_abs, 1e-12))) AS bin, count(*) AS n
        FROM latest_results WHERE max_abs IS NOT NULL AND isfinite(max_abs)
        GROUP BY ALL ORDER BY variant, bin
    """,
    "models": """
        SELECT m.* EXCLUDE (job_seq, job_key, run_id), coalesce(runs.name, m.run_id) AS run
        FROM dash_models m JOIN runs USING (run_id) ORDER BY m.id
    """,
    # Where each variant runs, and how fast: one row per target x variant. ONNX Runtime on the CPU that converted
    # the model is the verdict (every results row, its benchmark latency: noisy ones left out of the median); each
    # deployment target beside it reads compat_by_target (the latest job of each model): its statuses, its version
    # and the median of its p50s (5 calls of the first saved case). A DB without target rows shows ort-cpu alone.
    "targets": f"""
        WITH verdict AS (
            SELECT '{VERDICT_TARGET}' AS target, 'ONNX Runtime (CPU): the verdict of verify' AS label,
                max(versions['onnxruntime']) AS version, variant, count(*) AS models,
                count(*) FILTER (WHERE status = 'passed') AS passed, count(*) FILTER (WHERE status = 'failed') AS failed,
                0 AS unsupported, count(*) FILTER (WHERE status NOT IN ('passed', 'failed')) AS other,
                median(ort_p50_ms) FILTER (WHERE status = 'passed' AND NOT coalesce(bench_noisy, false)) AS median_p50_ms,
                count(ort_p50_ms) FILTER (WHERE status = 'passed' AND NOT coalesce(bench_noisy, false)) AS timed,
                count(ort_p50_ms) FILTER (WHERE status = 'passed' AND bench_noisy) AS noisy
            FROM latest_results
            WHERE variant IS NOT NULL
            GROUP BY variant
        ), deployed AS (
            SELECT target, string_agg(DISTINCT providers, ', ') AS label, max(target_version) AS version, variant,
                count(*) AS models, count(*) FILTER (WHERE status = 'passed') AS passed,
                count(*) FILTER (WHERE status = 'failed') AS failed,
                count(*) FILTER (WHERE status = 'unsupported') AS unsupported,
                count(*) FILTER (WHERE status NOT IN ('passed', 'failed', 'unsupported')) AS other,
                median(latency_ms) FILTER (WHERE status = 'passed') AS median_p50_ms,
                count(latency_ms) FILTER (WHERE status = 'passed') AS timed, NULL::BIGINT AS noisy
            FROM compat_by_target
            WHERE target <> '{VERDICT_TARGET}'
            GROUP BY target, variant
        )
        SELECT * FROM (SELECT * FROM verdict UNION ALL BY NAME SELECT * FROM deployed)
        ORDER BY {_TARGET_ORDER}, target, {_VARIANT_ORDER}
    """,
    # The deployment targets' failures (and unsupported models) by normalised message, as the signatures above.
    "target_signatures": f"""
        SELECT target, status, signature, n, models, sample_models[1:5] AS sample_models, left(example, 400) AS example
        FROM target_signatures ORDER BY n DESC, target, signature LIMIT {TOP_SIGNATURES}
    """,
    "model_count": """
        SELECT count(DISTINCT job_seq) FROM latest_results WHERE failure_kind IS DISTINCT FROM 'manifest_error'
    """,
}

HISTORY_RUNS = 10
_STATUS_PER_VARIANT = ",\n".join(f"any_value(r.status) FILTER (WHERE r.variant = '{v}') AS {v}" for v in VARIANTS)

DETAIL_QUERIES: dict[str, str] = {
    "detail_variants": f"""
        SELECT m.id, r.variant, r.status, r.failure_kind, r.stage, r.message, r.max_abs, r.max_rel, r.min_cosine,
            r.ort_p50_ms, r.ort_p90_ms, r.torch_p50_ms, r.torch_p90_ms, r.speedup, r.size_bytes,
            r.bench_noisy, r.bench_threads, r.bench_shape, r.bench_cpu, r.bench_load, r.ort_spread, r.torch_spread,
            r.bench_note, r.verify_s, r.benchmark_s, left(r.traceback, 4000) AS traceback,
            r.generation_steps, r.generation_max_abs, r.generation_min_cosine, r.generation_token_match,
            r.generation_note
        FROM dash_models m JOIN results r USING (job_seq) ORDER BY m.id, list_position({list(VARIANTS)}, r.variant)
    """,
    "detail_outputs": """
        SELECT m.id, v.variant, v.output, v.shape, v.max_abs, v.max_rel, v.cosine, v.n_nan, v.n_inf, v.passed
        FROM dash_models m JOIN verification v USING (run_id, job_key) ORDER BY m.id, v.variant, v.output, v.shape
    """,
    "detail_census": """
        SELECT m.id, list(struct_pack(op := c.op, n := c.n) ORDER BY c.n DESC, c.op) AS ops
        FROM dash_models m JOIN op_census c USING (run_id, job_key) GROUP BY m.id ORDER BY m.id
    """,
    # The tolerances are the run's settings (Settings.tolerances, recorded by the farm).
    "detail_stages": """
        SELECT m.id, any_value(r.fetch_s) AS fetch_s, any_value(r.export_s) AS export_s,
            any_value(r.check_s) AS check_s, any_value(r.optimize_s) AS optimize_s,
            any_value(r.versions) AS versions, any_value(r.resolved_revision) AS resolved_revision,
            any_value(r.artifacts_dir) AS artifacts_dir,
            any_value(json_extract(runs.settings, '$.tolerances'))::VARCHAR AS tolerances
        FROM dash_models m JOIN results r USING (job_seq) JOIN runs ON runs.run_id = m.run_id
        GROUP BY m.id ORDER BY m.id
    """,
    "detail_history": f"""
        WITH jobs AS (
            SELECT m.id, r.job_seq, any_value(coalesce(runs.name, r.run_id)) AS run,
                any_value(strftime(runs.started_at, '%Y-%m-%d %H:%M')) AS started_at,
                any_value(r.job_status) AS job_status, any_value(r.resolved_revision) AS resolved_revision,
                -- one FILTER per variant: a map_from_entries(list(...)) per job costs 7x as much
                {_STATUS_PER_VARIANT},
                any_value(r.max_abs) FILTER (WHERE r.variant = 'fp32') AS max_abs,
                any_value(r.ort_p50_ms) FILTER (WHERE r.variant = 'fp32') AS ort_p50_ms,
                coalesce(any_value(r.bench_noisy) FILTER (WHERE r.variant = 'fp32'), false) AS ort_p50_noisy,
                any_value(r.failure_kind) AS failure_kind
            FROM dash_models m
            JOIN results r ON r.source = m.source AND r.revision IS NOT DISTINCT FROM m.revision
                AND r.exporter IS NOT DISTINCT FROM m.exporter
                AND r.opset_requested IS NOT DISTINCT FROM m.opset_requested
            JOIN runs ON runs.run_id = r.run_id
            GROUP BY m.id, r.job_seq
        )
        SELECT * FROM jobs
        QUALIFY row_number() OVER (PARTITION BY id ORDER BY job_seq DESC) <= {HISTORY_RUNS}
        ORDER BY id, job_seq DESC
    """,
    # Where the model runs: per target and variant its status, version and latency: ONNX Runtime's verdict (results)
    # first, then each deployment target's row of the model's latest job (compat_by_target).
    "detail_targets": f"""
        SELECT * FROM (
            SELECT m.id, '{VERDICT_TARGET}' AS target, r.versions['onnxruntime'] AS version, r.variant, r.status,
                r.max_abs, r.ort_p50_ms AS p50_ms, coalesce(r.bench_noisy, false) AS noisy, r.failure_kind,
                left(r.message, 300) AS message, NULL AS providers
            FROM dash_models m JOIN results r USING (job_seq)
            WHERE r.variant IS NOT NULL
            UNION ALL BY NAME
            SELECT m.id, t.target, t.target_version AS version, t.variant, t.status, t.max_abs, t.latency_ms AS p50_ms,
                false AS noisy, NULL AS failure_kind, left(t.message, 300) AS message, t.providers
            FROM dash_models m JOIN compat_by_target t ON t.job_key = m.job_key AND t.run_id = m.run_id
            WHERE t.target <> '{VERDICT_TARGET}'
        )
        ORDER BY id, {_VARIANT_ORDER}, {_TARGET_ORDER}, target
    """,
    # The latest publish outcome of any job of the model (publish records one row per attempt).
    "detail_publication": """
        WITH published AS (
            SELECT r.source, r.revision, r.exporter, r.opset_requested,
                arg_max(p.repo_id, p.published_at) AS repo_id, arg_max(p.status, p.published_at) AS status,
                arg_max(p.commit_url, p.published_at) AS commit_url,
                strftime(max(p.published_at), '%Y-%m-%d %H:%M') AS published_at
            FROM publications p
            JOIN (SELECT DISTINCT job_key, source, revision, exporter, opset_requested
                  FROM results SEMI JOIN publications USING (job_key)) r USING (job_key)
            GROUP BY ALL
        )
        SELECT m.id, p.repo_id, p.status, p.commit_url, p.published_at
        FROM dash_models m JOIN published p ON p.source = m.source AND p.revision IS NOT DISTINCT FROM m.revision
            AND p.exporter IS NOT DISTINCT FROM m.exporter AND p.opset_requested IS NOT DISTINCT FROM m.opset_requested
        ORDER BY m.id
    """,
}


def collect(con: Con, timer: Callable[[str, float], None] | None = None) -> dict[str, Any]:
    """Run every panel query; ``timer(name, seconds)`` hears how long each took."""
    data: dict[str, Any] = {}
    _timed("models_table", lambda: con.execute(_MODELS), timer)
    # A literal run_seq lets DuckDB filter early; a scalar subquery there costs 50% more.
    (latest_seq,) = con.execute("SELECT coalesce(max(run_seq), 0) FROM runs").fetchall()[0]
    for name, sql in {**QUERIES, **DETAIL_QUERIES}.items():
        data[name] = _timed(name, functools.partial(_records, con, sql), timer)
    data["regressions"] = _timed("regressions", lambda: regression_rows(con, latest_seq, latest_seq,
                                                                          limit=MAX_REGRESSIONS), timer)
    _name_models(data)
    data["headline"] = data["headline"][0]
    data["model_count"] = next(iter(data["model_count"][0].values()))
    data["model_cap"] = MODEL_CAP
    data["noisy_ci"] = NOISY_CI
    data["variants"] = list(VARIANTS)
    return data


def _timed(name: str, fn: Callable[[], Any], timer: Callable[[str, float], None] | None) -> Any:
    t0 = time.perf_counter()
    out = fn()
    if timer:
        timer(name, time.perf_counter() - t0)
    return out


def _records(con: Con, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, row)) for row in cur.fetchall()]


def display_names(sources: list[str]) -> dict[str, str]:
    """A readable name per source: a local folder's last part (more parts where two would read alike), a Hub id as it is.

    ``/work/zoo/bert`` reads ``bert``; ``/a/x/bert`` and ``/b/y/bert`` read ``x/bert`` and ``y/bert``.
    """
    parts = {s: [p for p in s.replace("\\", "/").split("/") if p] or [s] for s in set(sources)}
    local = {s for s in parts if s.startswith(("/", ".", "~")) or (len(s) > 1 and s[1] == ":")}
    depth = {s: (1 if s in local else len(parts[s])) for s in parts}
    while True:
        names: dict[str, list[str]] = {}
        for s in parts:
            names.setdefault("/".join(parts[s][-depth[s]:]), []).append(s)
        clash = [s for same in names.values() if len(same) > 1 for s in same if depth[s] < len(parts[s])]
        if not clash:
            return {s: "/".join(parts[s][-depth[s]:]) for s in parts}
        for s in clash:
            depth[s] += 1


def _name_models(data: dict[str, Any]) -> None:
    """Give every model row, regression and signature example its readable name (the source stays, for titles)."""
    sources = [m["source"] for m in data["models"]] + [r["source"] for r in data["regressions"]]
    sources += [s for sig in (*data["signatures"], *data["target_signatures"]) for s in sig["sample_models"] or ()]
    names = display_names(sources)
    for row in (*data["models"], *data["regressions"]):
        row["name"] = names[row["source"]]
    for sig in (*data["signatures"], *data["target_signatures"]):
        sig["sample_names"] = [names[s] for s in sig["sample_models"] or ()]

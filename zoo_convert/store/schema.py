"""The compatibility database's schema: tables, views and numbered migrations.

A migration is applied once, in its own transaction, and recorded in
``schema_migrations``. Never edit a released migration; append a new one.

Tables::

    runs              one row per farm run (manifest, toolchain, resources, counts, its
                      optional unique name)
    results           one terminal row per job and variant; a job that failed before
                      any artifact existed has one row with variant NULL
    verification      ORT vs PyTorch per job, variant, output and input shape
    op_census         ONNX op counts of each job's fp32 graph
    publications      one row per model and publish attempt (publish/)
    schema_migrations which migrations this file has

Views (the model identity is source + revision + exporter + requested opset)::

    latest_results    every variant row of the latest recorded job per model
    result_cells      results with a pre-artifact failure counted failed in every default variant
    compat_matrix     model type x opset x variant -> pass rate and inconclusive cells, over latest results
    regressions       a cell that passed and now fails, max error grew tenfold, or ORT p50
                      latency 20% slower (neither latency noisy; for the same checkpoint, also 20% slower than
                      the job's own PyTorch figure moved), vs the same variant of the model's previous job
                      (``results.previous_job_seq``, set by the writer)
    failure_signatures latest failures grouped by normalised message (the row's own model type
                      and source replaced too: one cause, one signature)
    generation        latest variants of the models that generate: steps run with ORT's own cache,
                      worst step's logits, share of greedy tokens identical to PyTorch generate()
    compat_by_target  latest variants on each deployment target (``target_results``): source, model type,
                      task, variant, target, status, max abs, latency, message
    target_signatures latest target failures grouped by normalised message per target, as failure_signatures
"""

from __future__ import annotations

from dataclasses import dataclass

# The variants a pre-artifact failure (variant NULL) counts as failed in: the default ones, written
# out because migration 2 is released and must not change with records.VARIANTS. Counting it in the
# opt-in columns (uint8, q4) too would charge them with models that never asked for them.
VARIANT_VALUES = "('fp32'), ('fp16'), ('int8')"

_TABLES = """
CREATE TABLE runs (
    run_id        VARCHAR PRIMARY KEY,
    run_seq       INTEGER NOT NULL UNIQUE,
    manifest      VARCHAR,
    manifest_hash VARCHAR,
    versions      MAP(VARCHAR, VARCHAR),
    resources     JSON,
    settings      JSON,
    started_at    TIMESTAMP NOT NULL,
    finished_at   TIMESTAMP,
    status        VARCHAR NOT NULL,
    n_jobs        INTEGER,
    n_passed      INTEGER,
    n_failed      INTEGER
);

CREATE TABLE results (
    run_id            VARCHAR NOT NULL,
    job_key           VARCHAR NOT NULL,
    job_seq           BIGINT NOT NULL,
    previous_job_seq  BIGINT,  -- the same model's previous job, set by the writer
    recorded_at       TIMESTAMP NOT NULL,
    source            VARCHAR NOT NULL,
    revision          VARCHAR,
    resolved_revision VARCHAR,
    task              VARCHAR,
    model_type        VARCHAR,
    library           VARCHAR,
    exporter          VARCHAR,
    opset_requested   INTEGER,
    opset             INTEGER,
    ir_version        INTEGER,
    node_count        INTEGER,
    variant           VARCHAR,
    status            VARCHAR NOT NULL,
    job_status        VARCHAR NOT NULL,
    failure_kind      VARCHAR,
    stage             VARCHAR,
    message           VARCHAR,
    traceback         VARCHAR,
    fetch_s           DOUBLE,
    export_s          DOUBLE,
    check_s           DOUBLE,
    optimize_s        DOUBLE,
    verify_s          DOUBLE,
    benchmark_s       DOUBLE,
    peak_mem_mb       DOUBLE,
    file              VARCHAR,
    size_bytes        BIGINT,
    max_abs           DOUBLE,
    max_rel           DOUBLE,
    mean_abs          DOUBLE,
    min_cosine        DOUBLE,
    ort_p50_ms        DOUBLE,
    ort_p90_ms        DOUBLE,
    torch_p50_ms      DOUBLE,
    torch_p90_ms      DOUBLE,
    speedup           DOUBLE,
    optimizer         JSON,
    attempts          INTEGER,
    node              VARCHAR,
    manifest_row      INTEGER,
    tags              VARCHAR[],
    versions          MAP(VARCHAR, VARCHAR),
    artifacts_dir     VARCHAR,
    started_at        TIMESTAMP,
    finished_at       TIMESTAMP
);

CREATE TABLE verification (
    run_id   VARCHAR NOT NULL,
    job_key  VARCHAR NOT NULL,
    variant  VARCHAR NOT NULL,
    output   VARCHAR NOT NULL,
    shape    VARCHAR NOT NULL,
    max_abs  DOUBLE,
    max_rel  DOUBLE,
    mean_abs DOUBLE,
    cosine   DOUBLE,
    n_nan    BIGINT,
    n_inf    BIGINT,
    passed   BOOLEAN
);

CREATE TABLE op_census (
    run_id  VARCHAR NOT NULL,
    job_key VARCHAR NOT NULL,
    op      VARCHAR NOT NULL,
    n       INTEGER NOT NULL
);
"""

# Order matters: quoted names may hold paths, and paths may hold hex ids and numbers.
_SIGNATURE_MACRO = r"""
CREATE MACRO failure_signature(msg) AS left(trim(regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(msg,
        '''[^'']*''|"[^"]*"|`[^`]*`', '<name>', 'g'),
        '(?:[A-Za-z]:)?(?:[~.]?[/\\][^\s/\\:,;()\[\]]+)+[/\\]?', '<path>', 'g'),
        '\b(?:0x[0-9a-fA-F]+|[0-9a-fA-F]{7,})\b', '<hex>', 'g'),
        '[-+]?\b\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\b', '<n>', 'g'),
        '\s+', ' ', 'g')), 300);
"""

_VIEWS = f"""
CREATE VIEW latest_results AS
SELECT *
FROM results
QUALIFY job_seq = max(job_seq) OVER (PARTITION BY source, revision, exporter, opset_requested);

CREATE VIEW result_cells AS
SELECT r.* EXCLUDE (variant), coalesce(r.variant, v.variant) AS variant
FROM results r
LEFT JOIN (VALUES {VARIANT_VALUES}) v(variant) ON r.variant IS NULL
WHERE r.failure_kind IS DISTINCT FROM 'manifest_error';

CREATE VIEW compat_matrix AS
SELECT
    coalesce(c.model_type, 'unknown') AS model_type,
    coalesce(c.opset, c.opset_requested) AS opset,
    c.variant,
    count(*) AS models,
    count(*) FILTER (WHERE c.status = 'passed') AS passed,
    count(*) FILTER (WHERE c.status = 'passed') / count(*) AS pass_rate,
    list_sort(list_distinct(list(c.failure_kind))) AS failure_kinds
FROM result_cells c
SEMI JOIN latest_results l ON c.job_seq = l.job_seq
GROUP BY ALL;

-- A job is compared with its model's previous job through results.previous_job_seq:
-- one hash join, where windowing the whole history cost 1-2 s at 1M rows.
CREATE VIEW regressions AS
WITH pairs AS (
    SELECT c.*, runs.run_seq,
        p.run_id AS previous_run_id, p.status AS previous_status,
        p.max_abs AS previous_max_abs, p.ort_p50_ms AS previous_ort_p50_ms
    FROM result_cells c
    JOIN runs USING (run_id)
    JOIN result_cells p ON p.job_seq = c.previous_job_seq AND p.variant = c.variant
),
found AS (
    SELECT *, unnest([
        CASE WHEN previous_status = 'passed' AND status = 'failed' THEN 'broke' END,
        -- a floor of 1e-6 keeps float noise (1e-8 -> 1e-7) out of the list
        CASE WHEN max_abs > 10 * greatest(previous_max_abs, 1e-6) THEN 'error_grew' END,
        CASE WHEN status = 'passed' AND previous_status = 'passed'
             AND ort_p50_ms > 1.2 * previous_ort_p50_ms THEN 'slower' END
    ]) AS regression
    FROM pairs
)
SELECT run_id, run_seq, previous_run_id, regression, source, revision, exporter,
    coalesce(opset, opset_requested) AS opset, variant, model_type, task,
    previous_status, status, previous_max_abs, max_abs, previous_ort_p50_ms, ort_p50_ms,
    failure_kind, stage, message, job_key
FROM found
WHERE regression IS NOT NULL;

CREATE VIEW failure_signatures AS
SELECT
    failure_kind,
    stage,
    failure_signature(message) AS signature,
    count(*) AS n,
    count(DISTINCT source) AS models,
    list_sort(list_distinct(list(source)))[1:20] AS sample_models,
    any_value(message) AS example
FROM latest_results
WHERE status = 'failed'
GROUP BY ALL;
"""


_PUBLICATIONS = """
CREATE TABLE publications (
    run_id         VARCHAR NOT NULL,
    job_key        VARCHAR NOT NULL,
    source         VARCHAR NOT NULL,
    repo_id        VARCHAR NOT NULL,
    status         VARCHAR NOT NULL,
    commit_sha     VARCHAR,
    commit_url     VARCHAR,
    files          INTEGER,
    uploaded_files INTEGER,
    uploaded_bytes BIGINT,
    message        VARCHAR,
    published_at   TIMESTAMP NOT NULL
);
"""

# ``run --name``: a run a person can refer to (``db regressions --since nightly-2026-01-01``).
_RUN_NAMES = """
ALTER TABLE runs ADD COLUMN name VARCHAR;
CREATE UNIQUE INDEX runs_name ON runs (name);
"""


# The hard timeout a farm job ran under: a timeout is redone when a later run allows longer.
# The views are made again: DuckDB 1.x keeps a view's column types and refuses a view over
# ``results.*`` once the table has grown a column ("Contents of view were altered").
_RESULTS_TIMEOUT = "ALTER TABLE results ADD COLUMN timeout_s DOUBLE;\n" + _VIEWS.replace(
    "CREATE VIEW", "CREATE OR REPLACE VIEW"
)

# One cause, one signature: a message also names the model it failed on, by its model type
# (``llama for task``, ``(t5)``, ``M2M100Embeddings``: any case, ``-``/``_`` or nothing between
# the parts) and by its source (a hub id or a folder). Both are the row's own columns, so
# they are replaced exactly, before the general rules; the rules are migration 2's plus
# identifier lists in parentheses (``(encoder_model, decoder_model)``) and counts like ``2/30``
# (``<ratio>``; the path rule read them as ``2<path>``).
_SIGNATURES_BY_CAUSE = r"""
CREATE OR REPLACE MACRO failure_signature(msg, model_type := NULL, source := NULL) AS left(trim(regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    CASE WHEN coalesce(model_type, '') = '' THEN
        CASE WHEN position('/' IN coalesce(source, '')) > 0 THEN replace(msg, source, '<source>') ELSE msg END
    ELSE regexp_replace(regexp_replace(
        CASE WHEN position('/' IN coalesce(source, '')) > 0 THEN replace(msg, source, '<source>') ELSE msg END,
        '\b(' || regexp_replace(regexp_replace(model_type, '([^A-Za-z0-9_ -])', '\\\1', 'g'), '[-_ ]', '[-_ ]?', 'g')
            || ')(for|model|config|pretrained|embeddings|encoder|decoder|layer|attention|tokenizer'
            || '|imageprocessor|featureextractor|processor|onnxconfig)',
        '<model>\2', 'gi'),
        '\b' || regexp_replace(regexp_replace(model_type, '([^A-Za-z0-9_ -])', '\\\1', 'g'), '[-_ ]', '[-_ ]?', 'g')
            || '\b',
        '<model>', 'gi') END,
        '''[^'']*''|"[^"]*"|`[^`]*`', '<name>', 'g'),
        '\(\s*[A-Za-z_][\w.\-]+(?:\s*,\s*[A-Za-z_][\w.\-]+)*\s*\)', '(<name>)', 'g'),
        '\b\d+/\d+\b', '<ratio>', 'g'),
        '(?:[A-Za-z]:)?(?:[~.]?[/\\][^\s/\\:,;()\[\]]+)+[/\\]?', '<path>', 'g'),
        '\b(?:0x[0-9a-fA-F]+|[0-9a-fA-F]{7,})\b', '<hex>', 'g'),
        '[-+]?\b\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\b', '<n>', 'g'),
        '\s+', ' ', 'g')), 300);

CREATE OR REPLACE VIEW failure_signatures AS
SELECT
    failure_kind,
    stage,
    failure_signature(message, model_type := model_type, source := source) AS signature,
    count(*) AS n,
    count(DISTINCT source) AS models,
    list_sort(list_distinct(list(source)))[1:20] AS sample_models,
    any_value(message) AS example
FROM latest_results
WHERE status = 'failed'
GROUP BY ALL;
"""

# An inconclusive cell (verified against a PyTorch reference that proves nothing) is neither
# passed nor failed: the matrix counts it apart, and it is not a pass.
_INCONCLUSIVE_CELLS = """
CREATE OR REPLACE VIEW compat_matrix AS
SELECT
    coalesce(c.model_type, 'unknown') AS model_type,
    coalesce(c.opset, c.opset_requested) AS opset,
    c.variant,
    count(*) AS models,
    count(*) FILTER (WHERE c.status = 'passed') AS passed,
    count(*) FILTER (WHERE c.status = 'passed') / count(*) AS pass_rate,
    list_sort(list_distinct(list(c.failure_kind))) AS failure_kinds,
    count(*) FILTER (WHERE c.status = 'inconclusive') AS inconclusive
FROM result_cells c
SEMI JOIN latest_results l ON c.job_seq = l.job_seq
GROUP BY ALL;
"""


def _regressions_view(slower: str = "", previous: str = "", shown: str = "") -> str:
    """The regressions view: ``slower`` adds to ONNX Runtime's 20 % its further condition, ``previous`` the
    previous job's further columns, ``shown`` the view's (migrations 8 and 15)."""
    return f"""CREATE OR REPLACE VIEW regressions AS
WITH pairs AS (
    SELECT c.*, runs.run_seq,
        p.run_id AS previous_run_id, p.status AS previous_status,
        p.max_abs AS previous_max_abs, p.ort_p50_ms AS previous_ort_p50_ms,{previous}
        p.bench_noisy AS previous_bench_noisy
    FROM result_cells c
    JOIN runs USING (run_id)
    JOIN result_cells p ON p.job_seq = c.previous_job_seq AND p.variant = c.variant
),
found AS (
    SELECT *, unnest([
        CASE WHEN previous_status = 'passed' AND status = 'failed' THEN 'broke' END,
        -- a floor of 1e-6 keeps float noise (1e-8 -> 1e-7) out of the list
        CASE WHEN max_abs > 10 * greatest(previous_max_abs, 1e-6) THEN 'error_grew' END,
        CASE WHEN status = 'passed' AND previous_status = 'passed'
             AND NOT coalesce(bench_noisy, false) AND NOT coalesce(previous_bench_noisy, false)
             AND ort_p50_ms > 1.2 * previous_ort_p50_ms{slower} THEN 'slower' END
    ]) AS regression
    FROM pairs
)
SELECT run_id, run_seq, previous_run_id, regression, source, revision, exporter,
    coalesce(opset, opset_requested) AS opset, variant, model_type, task,
    previous_status, status, previous_max_abs, max_abs, previous_ort_p50_ms, ort_p50_ms,
    failure_kind, stage, message, job_key{shown}
FROM found
WHERE regression IS NOT NULL;
"""


# Latency you can trust (issue 12): each latency's runs, spread (IQR / p50) and conditions
# (threads, batch x length, CPU model, load average), whether it is noisy and why a verified
# variant has none. A noisy latency is no evidence of a slowdown: ``slower`` compares two
# quiet ones. Every view over ``results.*`` is made again (see ``_RESULTS_TIMEOUT``), each as
# its latest migration left it.
_LATENCY_CONDITIONS = (
    """
ALTER TABLE results ADD COLUMN ort_runs INTEGER;
ALTER TABLE results ADD COLUMN ort_spread DOUBLE;
ALTER TABLE results ADD COLUMN torch_runs INTEGER;
ALTER TABLE results ADD COLUMN torch_spread DOUBLE;
ALTER TABLE results ADD COLUMN bench_threads INTEGER;
ALTER TABLE results ADD COLUMN bench_shape VARCHAR;
ALTER TABLE results ADD COLUMN bench_cpu VARCHAR;
ALTER TABLE results ADD COLUMN bench_load DOUBLE;
ALTER TABLE results ADD COLUMN bench_noisy BOOLEAN;
ALTER TABLE results ADD COLUMN bench_note VARCHAR;
"""
    + f"""
CREATE OR REPLACE VIEW latest_results AS
SELECT *
FROM results
QUALIFY job_seq = max(job_seq) OVER (PARTITION BY source, revision, exporter, opset_requested);

CREATE OR REPLACE VIEW result_cells AS
SELECT r.* EXCLUDE (variant), coalesce(r.variant, v.variant) AS variant
FROM results r
LEFT JOIN (VALUES {VARIANT_VALUES}) v(variant) ON r.variant IS NULL
WHERE r.failure_kind IS DISTINCT FROM 'manifest_error';

{_regressions_view()}"""
    + _SIGNATURES_BY_CAUSE
    + _INCONCLUSIVE_CELLS
)

# The views over results bind ``*`` when created: a column added to results re-creates them,
# as migration 8 left them.
_RESULTS_VIEWS = _LATENCY_CONDITIONS[_LATENCY_CONDITIONS.index("CREATE OR REPLACE VIEW latest_results") :]
_EXPORTER_USED = (
    """
ALTER TABLE results ADD COLUMN exporter_used VARCHAR;
ALTER TABLE results ADD COLUMN exporter_reason VARCHAR;
"""
    + _RESULTS_VIEWS
)


# Generation, not one forward (issue 22): a decoder exported with past is run the way it is used,
# ONNX Runtime's cache step by step against PyTorch generate() (``zoo_convert.verify.generation``). Each
# variant row gets the steps compared, the worst step's logits and the share of ORT's own greedy
# tokens identical to PyTorch's (NULL for a model that does not generate); ``generation`` is the
# latest of those per model and variant. The views over ``results.*`` are made again (see
# ``_RESULTS_TIMEOUT``), as migration 8 left them.
_GENERATION = (
    """
ALTER TABLE results ADD COLUMN generation_steps INTEGER;
ALTER TABLE results ADD COLUMN generation_max_abs DOUBLE;
ALTER TABLE results ADD COLUMN generation_min_cosine DOUBLE;
ALTER TABLE results ADD COLUMN generation_token_match DOUBLE;
ALTER TABLE results ADD COLUMN generation_note VARCHAR;
"""
    + _LATENCY_CONDITIONS[_LATENCY_CONDITIONS.index("CREATE OR REPLACE VIEW latest_results") :]
    + """
CREATE VIEW generation AS
SELECT source, model_type, task, variant, status, failure_kind,
    generation_steps AS steps, generation_max_abs AS max_abs, generation_min_cosine AS min_cosine,
    generation_token_match AS token_match, generation_note AS note, job_key, run_id
FROM latest_results
WHERE generation_steps IS NOT NULL OR generation_note IS NOT NULL;
"""
)


# Deployment targets (issue 32): each variant checked on each target (ort-cpu, openvino,
# transformers.js, ort-cuda, ort-tensorrt) from the reference saved beside the artifacts, one row per
# (job, variant, target); a target never changes ``results.status``. ``compat_by_target`` reads the
# latest job of each model; ``target_signatures`` clusters its failures as ``failure_signatures`` does.
_TARGETS = """
CREATE TABLE target_results (
    run_id         VARCHAR NOT NULL,
    job_key        VARCHAR NOT NULL,
    variant        VARCHAR NOT NULL,
    target         VARCHAR NOT NULL,
    target_version VARCHAR,
    status         VARCHAR NOT NULL,
    message        VARCHAR,
    max_abs        DOUBLE,
    min_cosine     DOUBLE,
    latency_ms     DOUBLE,
    providers      VARCHAR,
    seconds        DOUBLE
);

CREATE VIEW compat_by_target AS
SELECT l.source, l.model_type, l.task, t.variant, t.target, t.target_version, t.status,
    t.max_abs, t.min_cosine, t.latency_ms, t.providers, t.message,
    l.status AS ort_status, l.exporter, coalesce(l.opset, l.opset_requested) AS opset, t.job_key, t.run_id
FROM target_results t
JOIN latest_results l ON l.job_key = t.job_key AND l.run_id = t.run_id AND l.variant = t.variant;

CREATE VIEW target_signatures AS
SELECT
    target,
    status,
    failure_signature(message, model_type := model_type, source := source) AS signature,
    count(*) AS n,
    count(DISTINCT source) AS models,
    list_sort(list_distinct(list(source)))[1:20] AS sample_models,
    any_value(message) AS example
FROM compat_by_target
WHERE status IN ('failed', 'unsupported')
GROUP BY ALL;
"""


# Verdicts that follow the output's scale (issue 33): a check passes when every element's
# |onnx - torch| is within max_abs + rtol * |torch| (``checks.Tolerance``); ``bound_used`` is the
# largest share of that bound an element used (at most 1 passes; 0 where the variant has no bound:
# int8, q4), so how close a passing model came to failing is a query. Only the table changes: no
# view reads ``verification``. The tolerances themselves are in ``runs.settings``.
_BOUND_USED = """
ALTER TABLE verification ADD COLUMN bound_used DOUBLE;
"""


# Which graph files a target ran (issue 32): a runtime other than ONNX Runtime is given a variant's graph
# of standard ONNX ops (``onnx/standard/model.onnx``) where the shipped one holds ONNX Runtime's contrib ops.
_TARGET_GRAPH = """
ALTER TABLE target_results ADD COLUMN graph VARCHAR;

CREATE OR REPLACE VIEW compat_by_target AS
SELECT l.source, l.model_type, l.task, t.variant, t.target, t.target_version, t.status,
    t.max_abs, t.min_cosine, t.latency_ms, t.providers, t.message,
    l.status AS ort_status, l.exporter, coalesce(l.opset, l.opset_requested) AS opset, t.job_key, t.run_id, t.graph
FROM target_results t
JOIN latest_results l ON l.job_key = t.job_key AND l.run_id = t.run_id AND l.variant = t.variant;
"""


# How well each latency's median is pinned down (issue 32): the width of its 95 % confidence interval over
# the median, from the samples' order statistics. ``bench_noisy`` is decided by it instead of the spread.
_LATENCY_CI = (
    """
ALTER TABLE results ADD COLUMN ort_ci DOUBLE;
ALTER TABLE results ADD COLUMN torch_ci DOUBLE;
"""
    + _RESULTS_VIEWS
)


# ``slower`` for the same checkpoint also asks the job's own PyTorch figure (issue 32): both sides are timed in
# the same second, so a machine that ran slower for the whole job moves both, and a slower conversion or runtime
# moves ONNX Runtime's alone. Between pairs of `make demo` runs of one code on the 2-core VM (20 ordered pairs of
# five runs, 2026-12-05/06) the ONNX-Runtime-only rule flagged 321 rows slower, none of them a regression; this one
# 130. A new checkpoint is compared as before: its PyTorch figure is another model's. (ONNX Runtime's ratio over
# PyTorch's, multiplied out: no division by a zero figure.)
_REGRESSIONS = _regressions_view(
    slower="""
             AND (resolved_revision IS DISTINCT FROM previous_resolved_revision
                  OR torch_p50_ms IS NULL OR previous_torch_p50_ms IS NULL
                  OR ort_p50_ms * previous_torch_p50_ms > 1.2 * previous_ort_p50_ms * torch_p50_ms)""",
    previous="""
        p.torch_p50_ms AS previous_torch_p50_ms, p.resolved_revision AS previous_resolved_revision,""",
    shown=", previous_torch_p50_ms, torch_p50_ms",
)
# What a later migration that adds a column to results re-runs (the views bind ``*`` when created): every view over
# results as the latest migrations left it.
_LATEST_RESULTS_VIEWS = _RESULTS_VIEWS + _REGRESSIONS


@dataclass(frozen=True)
class Migration:
    """One numbered, append-only schema change."""

    version: int
    name: str
    sql: str


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "tables", _TABLES),
    Migration(2, "views", _SIGNATURE_MACRO + _VIEWS),
    Migration(3, "publications", _PUBLICATIONS),
    Migration(4, "run names", _RUN_NAMES),
    Migration(5, "results.timeout_s", _RESULTS_TIMEOUT),
    Migration(6, "signatures by cause", _SIGNATURES_BY_CAUSE),
    Migration(7, "inconclusive cells", _INCONCLUSIVE_CELLS),
    Migration(8, "latency conditions", _LATENCY_CONDITIONS),
    Migration(9, "generation", _GENERATION),
    Migration(10, "exporter used", _EXPORTER_USED),
    Migration(11, "deployment targets", _TARGETS),
    Migration(12, "verification.bound_used", _BOUND_USED),
    Migration(13, "target graph", _TARGET_GRAPH),
    Migration(14, "latency median interval", _LATENCY_CI),
    Migration(15, "slower beside PyTorch", _REGRESSIONS),
)

SCHEMA_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       VARCHAR NOT NULL,
    applied_at TIMESTAMP NOT NULL DEFAULT now()
);
"""

LATEST_VERSION = MIGRATIONS[-1].version

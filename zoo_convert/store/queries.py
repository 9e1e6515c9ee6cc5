"""Read-side helpers behind ``zoo-convert db``: status, regressions, ad-hoc SQL, Parquet export."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeAlias, TypedDict

import duckdb

from ..errors import StoreError, UsageError
from .db import ResultStore

EXPORTED = ("runs", "results", "verification", "op_census", "publications",
            "latest_results", "compat_matrix", "regressions", "failure_signatures", "generation",
            "target_results", "compat_by_target", "target_signatures")

Row: TypeAlias = tuple[Any, ...]  # a DuckDB row: each value of its column's SQL type
Params: TypeAlias = Sequence[object] | Mapping[str, object] | None  # ? or $name parameters
# A value as JSON data, which is what _plain makes of a DuckDB value.
Plain: TypeAlias = str | int | float | bool | None | list["Plain"] | dict[str, "Plain"]


class RunStatus(TypedDict):
    """The latest run at a glance (``status()``), as ``db status`` prints it."""

    run_id: str
    name: str | None
    status: str
    manifest: str
    started_at: datetime
    finished_at: datetime | None
    jobs: int
    converted: int
    partial: int
    inconclusive: int
    not_converted: int
    variants_verified: int
    variants: int
    result_rows: int
    failure_kinds: dict[str, int]
    regressions: int
    runs: int
    targets: list[tuple[str, str | None, int, int, int, int, int]]


def query(store: ResultStore, sql: str, params: Params = None, *, untrusted: bool = False) -> tuple[list[str], list[Row]]:
    """Run one SQL statement; returns column names and rows.

    ``untrusted`` (what ``db query`` runs) turns DuckDB's external access off for the
    statement's connection, locked so the statement cannot turn it back on: no file read or
    written beside the database (``COPY ... TO``, ``EXPORT DATABASE``, ``read_text``,
    ``ATTACH``), no extension installed (a network fetch) or loaded.
    """
    with store.connect() as con:
        if untrusted:
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
        try:
            cur = con.execute(sql, params or [])
        except Exception as exc:  # noqa: BLE001 - any DuckDB error is the user's SQL: bad usage, exit 2
            # the first line: DuckDB's next ones point into the statement, and the CLI prints one line
            raise UsageError(f"query failed: {next((ln for ln in str(exc).splitlines() if ln.strip()), '')}") from exc
        if cur.description is None:
            return [], []
        return [d[0] for d in cur.description], cur.fetchall()


def status(store: ResultStore) -> RunStatus | None:
    """The latest run at a glance: models converted, variants verified, failure kinds, regressions.

    A model is converted when its fp32 graph verified; it is partial when a variant
    beside it failed; inconclusive when its fp32 graph matched a reference that proves
    nothing (neither converted nor not). Variants count the artifacts that were made.
    None when there is no run.
    """
    cols, rows = query(store, "SELECT * FROM runs ORDER BY run_seq DESC LIMIT 1")
    if not rows:
        return None
    run = dict(zip(cols, rows[0]))
    _, counts = query(
        store,
        """
        WITH jobs AS (
            SELECT job_key, any_value(job_status) = 'passed' AS converted,
                any_value(job_status) = 'inconclusive' AS inconclusive,
                bool_or(status = 'failed') AS any_failed, count(*) AS n_rows
            FROM results WHERE run_id = $run GROUP BY job_key
        )
        SELECT count(*), count(*) FILTER (WHERE converted), count(*) FILTER (WHERE converted AND any_failed),
            count(*) FILTER (WHERE inconclusive), coalesce(sum(n_rows), 0),
            (SELECT count(*) FILTER (WHERE status = 'passed') FROM results WHERE run_id = $run AND variant IS NOT NULL),
            (SELECT count(*) FROM results WHERE run_id = $run AND variant IS NOT NULL)
        FROM jobs
        """,
        {"run": run["run_id"]},
    )
    _, kinds = query(
        store,
        "SELECT failure_kind, count(DISTINCT job_key) AS n FROM results"
        " WHERE run_id = ? AND failure_kind IS NOT NULL GROUP BY ALL ORDER BY n DESC, failure_kind",
        [run["run_id"]],
    )
    _, regressed = query(store, "SELECT count(*) FROM regressions WHERE run_id = ?", [run["run_id"]])
    jobs, converted, partial, inconclusive, n_rows, variants_verified, variants = counts[0]
    # Per deployment target: rows, passed, failed, unsupported, not run (issue 32).
    _, on_targets = query(
        store,
        "SELECT target, max(target_version), count(*), count(*) FILTER (WHERE status = 'passed'),"
        " count(*) FILTER (WHERE status = 'failed'), count(*) FILTER (WHERE status = 'unsupported'),"
        " count(*) FILTER (WHERE status = 'not-run')"
        " FROM target_results WHERE run_id = ? GROUP BY target ORDER BY target",
        [run["run_id"]],
    )
    return RunStatus(
        run_id=run["run_id"],
        name=run["name"],
        status=run["status"],
        manifest=run["manifest"],
        started_at=run["started_at"],
        finished_at=run["finished_at"],
        jobs=jobs,
        converted=converted,
        partial=partial,
        inconclusive=inconclusive,
        not_converted=jobs - converted - inconclusive,
        variants_verified=variants_verified,
        variants=variants,
        result_rows=n_rows,
        failure_kinds=dict(kinds),
        regressions=regressed[0][0],
        runs=query(store, "SELECT count(*) FROM runs")[1][0][0],
        targets=[tuple(r) for r in on_targets],
    )


def format_status(info: RunStatus) -> str:
    """``status()`` as aligned lines for a terminal."""
    kinds = ", ".join(f"{k} {n}" for k, n in info["failure_kinds"].items()) or "none"
    lines = [
        ("run", run_label(info["run_id"], info["name"])),
        ("status", info["status"]),
        ("manifest", info["manifest"]),
        ("started_at", info["started_at"]),
        ("finished_at", info["finished_at"]),
        ("converted", f"{info['converted']} of {info['jobs']} models (fp32 verified)"),
        ("partial", f"{info['partial']} (converted, a variant failed)"),
        ("inconclusive", f"{info['inconclusive']} (the PyTorch reference proves nothing: constant, zero or non-finite)"),
        ("not converted", info["not_converted"]),
        ("variants", f"{info['variants_verified']} of {info['variants']} verified"),
        ("failure kinds", kinds),
        ("regressions", info["regressions"]),
        ("result rows", info["result_rows"]),
        ("runs", info["runs"]),
    ]
    # One line per deployment target, after the variants ORT verified.
    at = next(i for i, (key, _) in enumerate(lines) if key == "variants") + 1
    lines[at:at] = [
        ("target", f"{target:<16} {passed} of {n} variants passed ({version or 'version unknown'}), {failed} failed,"
                   f" {unsupported} unsupported, {not_run} not run")
        for target, version, n, passed, failed, unsupported, not_run in info.get("targets", [])
    ]
    return "\n".join(f"{key:<15}{value}" for key, value in lines)


def run_label(run_id: str, name: str | None) -> str:
    """How a run is shown to people: its name with its id, or its id."""
    return f"{name} ({run_id})" if name else run_id


def first_run_since(store: ResultStore, since: str) -> int:
    """The run_seq of the first run after ``since``: a run name, a run id or a date (UTC)."""
    run = store.find_run(since)
    if run is not None:
        return run[1] + 1
    try:
        when = datetime.fromisoformat(since)
    except ValueError:
        raise UsageError(f"since {since!r}: no run has that name or id, and it is no date (YYYY-MM-DD[THH:MM])") from None
    if when.tzinfo is not None:
        when = when.astimezone(timezone.utc).replace(tzinfo=None)
    _, rows = query(store, "SELECT coalesce(min(run_seq) FILTER (WHERE started_at >= ?), max(run_seq) + 1, 1) FROM runs",
                    [when])
    return int(rows[0][0])


REGRESSION_COLUMNS = ("run", "since_run", "regression", "source", "exporter", "opset", "variant", "changed",
                      "previous_max_abs", "max_abs", "previous_ort_p50_ms", "ort_p50_ms", "previous_torch_p50_ms",
                      "torch_p50_ms", "failure_kind", "message")


def regression_rows(con: duckdb.DuckDBPyConnection, first_seq: int, last_seq: int = 2**31 - 1,
                    limit: int | None = None) -> list[dict[str, Any]]:
    """Regressions of the runs ``first_seq``..``last_seq``, each saying what changed since the result it is compared with."""
    rows = con.execute(
        f"""
        WITH reg AS (
            SELECT * FROM regressions WHERE run_seq BETWEEN $first AND $last
            ORDER BY run_seq, source, variant, regression {'LIMIT ' + str(int(limit)) if limit else ''}
        ),
        jobs AS (
            SELECT r.run_id, r.job_key, any_value(r.resolved_revision) AS revision, any_value(r.versions) AS versions,
                any_value(r.previous_job_seq) AS previous_job_seq
            FROM results r SEMI JOIN reg ON r.run_id = reg.run_id AND r.job_key = reg.job_key
            GROUP BY ALL
        ),
        previous AS (
            SELECT p.job_seq, any_value(p.resolved_revision) AS revision, any_value(p.versions) AS versions
            FROM results p SEMI JOIN jobs ON p.job_seq = jobs.previous_job_seq
            GROUP BY ALL
        )
        SELECT coalesce(cur.name, reg.run_id) AS run, coalesce(prev_run.name, reg.previous_run_id) AS since_run, reg.*,
            jobs.revision AS _revision, jobs.versions AS _versions,
            previous.revision AS _previous_revision, previous.versions AS _previous_versions
        FROM reg
        JOIN runs cur ON cur.run_id = reg.run_id
        LEFT JOIN runs prev_run ON prev_run.run_id = reg.previous_run_id
        LEFT JOIN jobs ON jobs.run_id = reg.run_id AND jobs.job_key = reg.job_key
        LEFT JOIN previous ON previous.job_seq = jobs.previous_job_seq
        ORDER BY reg.run_seq, reg.source, reg.variant, reg.regression
        """,
        {"first": first_seq, "last": last_seq},
    )
    columns = [d[0] for d in rows.description]
    out = []
    for values in rows.fetchall():
        row = dict(zip(columns, values))
        row["changed"] = what_changed(row.pop("_previous_revision"), row.pop("_revision"),
                                      row.pop("_previous_versions"), row.pop("_versions"))
        out.append(row)
    return out


def what_changed(
    previous_revision: str | None, revision: str | None,
    previous_versions: dict[str, str] | None, versions: dict[str, str] | None,
) -> str:
    """What differs between two jobs of a model: the checkpoint and/or toolchain versions, in words."""
    changes = []
    if previous_revision != revision:
        changes.append(f"checkpoint {_short(previous_revision)} -> {_short(revision)}")
    before, after = previous_versions or {}, versions or {}
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            changes.append(f"{name} {before.get(name, '-')} -> {after.get(name, '-')}")
    return "; ".join(changes) or "same checkpoint and toolchain"


def _short(revision: str | None) -> str:
    if not revision:
        return "-"
    return revision.removeprefix("sha256:")[:10]


def regressions(store: ResultStore, since: str | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Regressions in the runs after ``since`` (a run name, id or date), or in the latest run when it is None."""
    if since is None:
        _, rows = query(store, "SELECT coalesce(max(run_seq), 0) FROM runs")
        first = rows[0][0]
    else:
        first = first_run_since(store, since)
    with store.connect() as con:
        found = regression_rows(con, first)
    return list(REGRESSION_COLUMNS), [tuple(r[c] for c in REGRESSION_COLUMNS) for r in found]


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


def format_table(columns: list[str], rows: list[Row], *, max_width: int = 60) -> str:
    """Rows as an aligned plain-text table, each cell cut at ``max_width`` characters."""
    cells = [[_cell(v, max_width) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def format_csv(columns: list[str], rows: list[Row]) -> str:
    """RFC 4180 CSV with a header row; values are never cut, nested ones are JSON."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_csv_cell(v) for v in row])
    return out.getvalue().rstrip("\n")


def format_json(columns: list[str], rows: list[Row]) -> str:
    """A JSON array of one object per row; NaN and infinities are null, timestamps ISO 8601."""
    return json.dumps([dict(zip(columns, (_plain(v) for v in row))) for row in rows], indent=1)


def format_markdown(columns: list[str], rows: list[Row]) -> str:
    """A GitHub-flavoured Markdown table; cells keep their full text on one line."""
    def cell(value: object) -> str:
        text = _cell(value, max_width=0)
        return text.replace("\\", "\\\\").replace("|", "\\|")

    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


FORMATS: dict[str, Callable[[list[str], list[Row]], str]] = {
    "table": format_table,
    "csv": format_csv,
    "json": format_json,
    "markdown": format_markdown,
}


def _csv_cell(value: object) -> str | int | float:
    if value is None:
        return ""
    if isinstance(value, (str, int, float)):  # bool is an int; a float keeps every digit (NaN as nan)
        return value
    plain = _plain(value)
    return plain if isinstance(plain, str) else json.dumps(plain)


def _plain(value: object) -> Plain:
    """A DuckDB value as JSON data: no NaN (not JSON), dates as ISO text, decimals as numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)  # UUID and the like


def _cell(value: object, max_width: int) -> str:
    text = "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
    text = " ".join(text.split())
    return text if not max_width or len(text) <= max_width else text[: max_width - 1] + "…"


def _sql_string(path: Path) -> str:
    return str(path).replace("'", "''")


def find_run(store: ResultStore, run: str) -> str:
    """``latest`` -> the newest run id; any other value must name a recorded run, by its name or id."""
    if run == "latest":
        rows = query(store, "SELECT run_id FROM runs ORDER BY run_seq DESC LIMIT 1")[1]
        if not rows:
            raise StoreError(f"{store.path} has no runs yet")
        return str(rows[0][0])
    found = store.find_run(run)
    if found is None:
        raise UsageError(f"no run named {run!r} (by name or id) in {store.path}")
    return found[0]


def run_settings(store: ResultStore, run_id: str) -> dict[str, Any]:
    """The settings a run recorded (``runs.settings``), parsed; empty when it recorded none."""
    rows = query(store, "SELECT settings FROM runs WHERE run_id = ?", [run_id])[1]
    try:
        settings = json.loads(rows[0][0] or "{}") if rows else {}
    except ValueError:
        return {}
    return settings if isinstance(settings, dict) else {}


def job_results(store: ResultStore, run_id: str, job_keys: list[str] | None = None) -> list[dict[str, Any]]:
    """The ``results`` rows of a run's jobs (all, or those keys), in recorded order.

    ``versions`` comes back as a dict and ``finished_at`` as an ISO-8601 string, whichever
    shapes the DuckDB driver returns them in.
    """
    sql = "SELECT * FROM results WHERE run_id = ?"
    params: list[object] = [run_id]
    if job_keys is not None:
        sql += " AND list_contains(?, job_key)"
        params.append(job_keys)
    columns, rows = query(store, sql + " ORDER BY job_seq, variant", params)
    out = []
    for row in rows:
        r = dict(zip(columns, row))
        r["versions"] = _as_dict(r["versions"])
        r["finished_at"] = r["finished_at"].isoformat() if r["finished_at"] else None
        out.append(r)
    return out


def job_targets(store: ResultStore, run_id: str, job_keys: list[str] | None = None) -> list[dict[str, Any]]:
    """The ``target_results`` rows of a run's jobs (all, or those keys): one per (job, variant, target)."""
    sql = ("SELECT job_key, variant, target, target_version, status, message, max_abs, min_cosine, latency_ms,"
           " providers, seconds FROM target_results WHERE run_id = ?")
    params: list[object] = [run_id]
    if job_keys is not None:
        sql += " AND list_contains(?, job_key)"
        params.append(job_keys)
    columns, rows = query(store, sql + " ORDER BY job_key, variant, target", params)
    return [dict(zip(columns, row)) for row in rows]


def latest_job_statuses(store: ResultStore, job_keys: list[str]) -> dict[str, int]:
    """How many of these jobs' latest results are passed, failed, inconclusive (``job_status``)."""
    if not job_keys:
        return {}
    rows = query(
        store,
        "SELECT status, count(*) FROM (SELECT arg_max(job_status, job_seq) AS status FROM results"
        " WHERE list_contains(?, job_key) GROUP BY job_key) GROUP BY status",
        [job_keys],
    )[1]
    return {str(s): int(n) for s, n in rows}


def deferred_publications(store: ResultStore) -> list[dict[str, Any]]:
    """Jobs whose latest ``publications`` row says ``deferred``: run_id, job_key, repo_id, oldest deferral first."""
    columns, rows = query(
        store,
        "SELECT run_id, job_key, arg_max(repo_id, published_at) AS repo_id,"
        " min(published_at) FILTER (WHERE status = 'deferred') AS deferred_at"
        " FROM publications GROUP BY run_id, job_key"
        " HAVING arg_max(status, published_at) = 'deferred' ORDER BY deferred_at, job_key",
    )
    return [dict(zip(columns, r)) for r in rows]


def published_jobs(store: ResultStore) -> set[tuple[str, str]]:
    """(job_key, repo_id) pairs whose latest ``publications`` row says the repo holds them (published or unchanged)."""
    rows = query(
        store,
        "SELECT job_key, repo_id FROM publications GROUP BY job_key, repo_id"
        " HAVING arg_max(status, published_at) IN ('published', 'unchanged')",
    )[1]
    return {(k, r) for k, r in rows}


def commits_since(store: ResultStore, since: datetime) -> int:
    """Commits publishing made after ``since`` (naive UTC, as the DB stores it)."""
    rows = query(store, "SELECT count(*) FROM publications WHERE status = 'published' AND published_at > ?", [since])[1]
    return int(rows[0][0])


def _as_dict(value: Any) -> dict[str, str]:
    """A DuckDB MAP as a dict: older drivers return ``{"key": [...], "value": [...]}``."""
    if isinstance(value, dict) and set(value) == {"key", "value"} and isinstance(value["key"], list):
        return dict(zip(value["key"], value["value"]))
    return dict(value or {})

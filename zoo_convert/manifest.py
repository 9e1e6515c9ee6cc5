"""Parquet in, validated entries out: every bad row is reported with its number and reason.

The manifest is one Parquet file, one row per checkpoint (see :data:`SCHEMA`).
Only ``source`` is required. A row expands into one job per requested opset
(``opsets`` null or empty: one job with the exporter's default opset). Row
numbers are 1-based, counting data rows.

Validation is vectorised with pyarrow.compute so a 100,000-row manifest checks
in well under two seconds; only the final expansion into
:class:`~zoo_convert.records.ManifestEntry` walks the rows in Python.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import ManifestError
from .records import (
    DEFAULT_VARIANTS,
    EXPORTERS,
    MAX_OPSET,
    MIN_OPSET,
    OPTIMIZATION_LEVELS,
    TARGETS,
    TASKS,
    VARIANTS,
    WITH_PAST,
    ManifestEntry,
)
from .sources import HUB_ID_FORBIDDEN, HUB_ID_FORBIDDEN_SUFFIX, HUB_ID_PATTERN

SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("task", pa.string()),
        pa.field("revision", pa.string()),
        pa.field("opsets", pa.list_(pa.int32())),
        pa.field("exporter", pa.string()),
        pa.field("variants", pa.list_(pa.string())),
        pa.field("timeout_s", pa.float64()),
        pa.field("memory_gb", pa.float64()),
        pa.field("gpu", pa.bool_()),
        pa.field("allow_remote_code", pa.bool_()),
        pa.field("allow_pickle", pa.bool_()),
        pa.field("priority", pa.int32()),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("optimize", pa.string()),  # O1, O2 or O3; null: the run's --optimize
        pa.field("targets", pa.list_(pa.string())),  # deployment targets; null: the run's --targets
    ]
)
REQUIRED = ("source",)

_PATH_PREFIXES = ("/", "./", "../", "~")


@dataclass(frozen=True)
class Manifest:
    """A read and validated manifest.

    Attributes:
        path: the Parquet file.
        rows: number of data rows.
        entries: one job per valid row and opset, in row order.
        problems: every invalid row (``row`` set) or file-level fault (``row`` None).
        bad_rows: row number -> the raw values of each invalid row, for recording.
        warnings: things worth saying that do not invalidate anything (unknown columns).
        sha256: hash of the file's bytes, recorded with each run.
        duplicates: row number -> the earlier row it repeats (same source, revision, task, opset and
            exporter): ignored, said once in a summary (:attr:`duplicates_summary`), never a job nor a result.
    """

    path: Path
    rows: int
    entries: tuple[ManifestEntry, ...]
    problems: tuple[ManifestError, ...]
    bad_rows: dict[int, dict[str, Any]]
    warnings: tuple[str, ...] = ()
    sha256: str = ""
    duplicates: dict[int, int] = dataclasses.field(default_factory=dict)

    @property
    def duplicates_summary(self) -> str | None:
        """One line on the duplicate rows (the first few named), or None without any."""
        if not self.duplicates:
            return None
        named = ", ".join(f"row {row} = row {first}" for row, first in list(self.duplicates.items())[:5])
        more = f" and {len(self.duplicates) - 5} more" if len(self.duplicates) > 5 else ""
        return (f"{len(self.duplicates)} duplicate rows ignored (the same source, revision, task, opset and exporter"
                f" as an earlier row): {named}{more}")  # fmt: skip

    @property
    def file_problems(self) -> tuple[ManifestError, ...]:
        """Faults of the whole file (unreadable, missing or mistyped column): nothing can run."""
        return tuple(p for p in self.problems if p.row is None)


def read_manifest(path: str | Path) -> Manifest:
    """Read a Parquet manifest and validate every row; never raises for bad content."""
    path = Path(path)
    try:
        data = path.read_bytes()
        table = pq.read_table(pa.BufferReader(data))
    except (OSError, pa.ArrowException) as exc:
        problem = ManifestError(f"cannot read Parquet file {path}: {exc}")
        return Manifest(path=path, rows=0, entries=(), problems=(problem,), bad_rows={})
    return validate_table(table, base_dir=path.parent.resolve(), path=path, sha256=hashlib.sha256(data).hexdigest())


def validate_table(table: pa.Table, *, base_dir: Path, path: Path = Path("<table>"), sha256: str = "") -> Manifest:
    """Validate an Arrow table against :data:`SCHEMA` and expand its valid rows into jobs."""
    table, file_problems, warnings = _conform(table)
    if not file_problems and table.num_rows == 0:
        file_problems.append(ManifestError(f"{path} has no rows: nothing to convert"))
    if file_problems:
        return Manifest(path, table.num_rows, (), tuple(file_problems), {}, tuple(warnings), sha256)
    n = table.num_rows
    reasons: list[list[str]] = [[] for _ in range(n)]

    def flag(mask: pa.Array | pa.ChunkedArray, reason: str | Callable[[int], str]) -> None:
        # mask: true on bad rows; reason: a text, or a function of the row index (called on bad rows only)
        for i in pc.indices_nonzero(pc.fill_null(mask, False)).to_pylist():
            reasons[i].append(reason if isinstance(reason, str) else reason(i))

    col = table.column
    source = col("source")
    flag(pc.or_kleene(pc.is_null(source), pc.equal(pc.utf8_trim_whitespace(source), "")), "missing source")
    # a '..' component could walk out of the manifest's folder or the hub cache
    flag(pc.match_substring_regex(source, r"(^|/)\.\.(/|$)"), "source must not contain a '..' path component")
    base = str(base_dir)
    # once per distinct source: a folder named on 50,000 rows is looked up once, not 50,000 times
    given = source.to_pylist()
    resolved = {s: _resolve_source(s, base) for s in dict.fromkeys(given)}
    sources = [resolved[s] for s in given]
    local = pa.array([s is not None and _looks_local(s) for s in sources])
    hub_ok = pc.match_substring_regex(source, HUB_ID_PATTERN)  # sources.is_hub_id, a column at a time
    for part in HUB_ID_FORBIDDEN:
        hub_ok = pc.and_kleene(hub_ok, pc.invert(pc.match_substring(source, part)))
    hub_ok = pc.and_kleene(hub_ok, pc.invert(pc.ends_with(source, HUB_ID_FORBIDDEN_SUFFIX)))
    bad_hub = pc.and_kleene(pc.invert(local), pc.invert(hub_ok))
    bad_hub = pc.and_kleene(bad_hub, pc.invert(pc.match_substring_regex(source, r"(^|/)\.\.(/|$)")))
    bad_hub = pc.and_kleene(bad_hub, pc.invert(pc.equal(pc.utf8_trim_whitespace(source), "")))  # "missing source" says it
    flag(bad_hub, lambda i: f"invalid repo id {sources[i]!r} (hub ids are 'name' or 'org/name' without '..' or '--')")
    folders = {s: os.path.isdir(s) for s in resolved.values() if s is not None and _looks_local(s)}
    missing_dir = [s in folders and not folders[s] for s in sources]
    flag(pa.array(missing_dir), lambda i: f"local checkpoint folder not found: {sources[i]}")
    # A folder is converted as it is on disk (its content hash is its revision): a revision would be ignored,
    # and two rows of one folder with two revisions would be one job twice.
    revision = col("revision")
    flag(pc.and_kleene(local, pc.invert(pc.is_null(revision))),
         lambda i: f"revision {revision[i].as_py()!r} given for a local folder, which has none: leave it empty")  # fmt: skip

    task = col("task")
    known = pc.or_kleene(pc.is_in(task, value_set=pa.array(sorted(TASKS))), pc.is_null(task))
    stripped = pc.replace_substring_regex(task, WITH_PAST + "$", "")
    known = pc.or_kleene(known, pc.is_in(stripped, value_set=pa.array(sorted(TASKS))))
    flag(pc.invert(known), lambda i: f"unknown task {task[i].as_py()!r}")

    exporter = col("exporter")
    flag(pc.invert(pc.or_kleene(pc.is_null(exporter), pc.is_in(exporter, value_set=pa.array(EXPORTERS)))),
         lambda i: f"unknown exporter {exporter[i].as_py()!r} (choose from {', '.join(EXPORTERS)})")  # fmt: skip

    level = col("optimize")
    flag(pc.invert(pc.or_kleene(pc.is_null(level), pc.is_in(level, value_set=pa.array(OPTIMIZATION_LEVELS)))),
         lambda i: f"unknown optimize level {level[i].as_py()!r} (choose from {', '.join(OPTIMIZATION_LEVELS)}"
                   + ("; O4, O3 in fp16, is the fp16 variant: ask for it in variants" if level[i].as_py() == "O4" else "")
                   + ")")  # fmt: skip

    _flag_list(table, "opsets", flag, lambda v: pc.or_kleene(pc.less(v, MIN_OPSET), pc.greater(v, MAX_OPSET)),
               f"impossible opset (supported: {MIN_OPSET}..{MAX_OPSET})")  # fmt: skip
    _flag_list(table, "variants", flag, lambda v: pc.invert(pc.is_in(v, value_set=pa.array(VARIANTS))),
               f"unknown variant (choose from {', '.join(VARIANTS)})")  # fmt: skip
    flag(pc.equal(pc.list_value_length(col("variants")), 0), "empty variants list")
    _flag_list(table, "targets", flag, lambda v: pc.invert(pc.is_in(v, value_set=pa.array(TARGETS))),
               f"unknown target (choose from {', '.join(TARGETS)})")  # fmt: skip
    for name in ("timeout_s", "memory_gb"):
        v = col(name)
        flag(pc.invert(pc.and_kleene(pc.greater(v, 0), pc.is_finite(v))), f"{name} must be a positive number")

    rows = _rows(table)
    entries: list[ManifestEntry] = []
    seen: dict[_JobId, int] = {}
    duplicates: dict[int, int] = {}
    for i, row in enumerate(rows):
        source_i = sources[i]
        if reasons[i] or source_i is None:  # no source: its row already says "missing source"
            continue
        expanded = _expand(row, source_i, i + 1)
        dupes = [seen[k] for k in (_job_id(e) for e in expanded) if k in seen]
        if dupes:
            duplicates[i + 1] = dupes[0]
            continue
        seen.update({_job_id(e): i + 1 for e in expanded})
        entries.extend(expanded)
    problems = tuple(ManifestError("; ".join(r), row=i + 1) for i, r in enumerate(reasons) if r)
    bad_rows = {p.row: rows[p.row - 1] for p in problems if p.row is not None}
    return Manifest(path, n, tuple(entries), problems, bad_rows, tuple(warnings), sha256, duplicates)


def row_key(row: int, values: dict[str, Any]) -> str:
    """Stable job key of an invalid row: its number and content (there is no job to key)."""
    blob = json.dumps({"row": row, "values": values}, sort_keys=True, default=str)
    return "manifest:" + hashlib.sha256(blob.encode()).hexdigest()[:32]


def _conform(table: pa.Table) -> tuple[pa.Table, list[ManifestError], list[str]]:
    """Cast columns to SCHEMA within a type family (int64 -> int32, large_string -> string), add absent ones."""
    problems: list[ManifestError] = []
    warnings = [f"unknown column {c!r} ignored" for c in table.column_names if c not in SCHEMA.names]
    columns = []
    for field in SCHEMA:
        if field.name not in table.column_names:
            if field.name in REQUIRED:
                problems.append(ManifestError(f"missing required column {field.name!r}", column=field.name))
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        column = table.column(field.name)
        if column.type != field.type:
            if not _same_family(column.type, field.type):
                problems.append(
                    ManifestError(f"column {field.name!r} is {column.type}, expected {field.type}", column=field.name)
                )
                columns.append(pa.nulls(table.num_rows, field.type))
                continue
            try:
                column = column.cast(field.type)
            except pa.ArrowInvalid as exc:
                problems.append(ManifestError(f"column {field.name!r}: {exc}", column=field.name))
                columns.append(pa.nulls(table.num_rows, field.type))
                continue
        columns.append(column)
    schema = pa.schema([f.with_nullable(True) for f in SCHEMA])
    return pa.Table.from_arrays(columns, schema=schema), problems, warnings


def _same_family(got: pa.DataType, want: pa.DataType) -> bool:
    if pa.types.is_null(got):
        return True
    if pa.types.is_list(want):
        if not (pa.types.is_list(got) or pa.types.is_large_list(got)):
            return False
        return _same_family(got.value_type, want.value_type)
    for family in (pa.types.is_string, pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean):
        if family(want):
            return family(got) or (family is pa.types.is_string and pa.types.is_large_string(got)) or (
                family is pa.types.is_floating and pa.types.is_integer(got)
            )
    return False


# Marks the rows a mask is true on as bad, with a reason (a text, or a function of the row index).
_Flag = Callable[[pa.Array | pa.ChunkedArray, str | Callable[[int], str]], None]


def _flag_list(
    table: pa.Table, name: str, flag: _Flag, bad_value: Callable[[pa.Array], pa.Array], reason: str
) -> None:
    """Flag rows of a list column holding a null or a bad element."""
    column = table.column(name).combine_chunks()
    values = pc.list_flatten(column)
    parents = pc.list_parent_indices(column)
    bad = pc.fill_null(bad_value(values), True)
    rows = sorted(set(pc.filter(parents, bad).to_pylist()))
    if rows:
        mask = [False] * table.num_rows
        for r in rows:
            mask[r] = True
        flag(pa.array(mask), lambda i: f"{reason}: {column[i].as_py()}")


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    return [dict(zip(cols, values)) for values in zip(*cols.values())]


def _expand(row: dict[str, Any], source: str, number: int) -> list[ManifestEntry]:
    opsets = sorted(set(row["opsets"])) if row["opsets"] else [None]
    variants = tuple(dict.fromkeys(row["variants"])) if row["variants"] else DEFAULT_VARIANTS
    return [
        ManifestEntry(
            source=source,
            task=row["task"],
            revision=row["revision"],
            opset=opset,
            exporter=row["exporter"] or "optimum",
            variants=variants,
            timeout_s=row["timeout_s"],
            memory_gb=row["memory_gb"],
            gpu=bool(row["gpu"]),
            allow_remote_code=bool(row["allow_remote_code"]),
            allow_pickle=bool(row["allow_pickle"]),
            priority=row["priority"] or 0,
            tags=tuple(row["tags"] or ()),
            row=number,
            optimize=row["optimize"],
            targets=tuple(dict.fromkeys(row["targets"])) if row["targets"] is not None else None,
        )
        for opset in opsets
    ]


# What makes two jobs the same: source, revision, task, opset, exporter.
_JobId = tuple[str, str | None, str | None, int | None, str]


def _job_id(e: ManifestEntry) -> _JobId:
    return (e.source, e.revision, e.task, e.opset, e.exporter)


def _looks_local(source: str) -> bool:
    return source.startswith(_PATH_PREFIXES)


def _resolve_source(source: str | None, base_dir: str) -> str | None:
    """A relative path that exists next to the manifest becomes absolute; hub ids stay as they are."""
    if source is None or not source.strip():
        return None
    if source.startswith("~"):
        return os.path.expanduser(source)
    if source.startswith("/"):
        return source
    candidate = os.path.join(base_dir, source)
    if source.startswith(("./", "../")) or os.path.exists(candidate):
        return os.path.normpath(candidate)
    return source


def write_manifest(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows (dicts keyed by :data:`SCHEMA` column names; absent keys are null) as a manifest."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(_table(rows), path)
    return path


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    # nullable: a writer may produce bad rows on purpose (tests); read_manifest reports them
    schema = pa.schema([f.with_nullable(True) for f in SCHEMA])
    return pa.Table.from_pylist([{name: row.get(name) for name in SCHEMA.names} for row in rows], schema=schema)


# CSV columns copied as they are into the manifest column of the same name (a CSV's own "source" column, where it has
# one, says where the id was found, not what to convert: the id is ``model_id``).
_CSV_COLUMNS = ("revision", "exporter", "optimize")


def manifest_from_csv(csv_path: str | Path, out_path: str | Path) -> tuple[int, list[str]]:
    """Build a manifest of hub ids from a CSV with a ``model_id`` column and optional ``task``, ``library``,
    ``revision``, ``exporter``, ``optimize`` and ``model_type`` columns.

    Returns the number of rows written and why the others were dropped: every check ``manifest
    validate`` makes (invalid id, unknown task or exporter, a revision for a local folder...) and
    duplicates, each named by its CSV row (the header is row 0). Tags carry the library, ``tiny``
    for test models and ``model_type:<type>`` where the CSV has a ``model_type`` column.
    """
    import csv

    rows: list[dict[str, Any]] = []
    numbers: list[int] = []  # the CSV row of each of rows
    dropped: list[tuple[int, str]] = []
    seen: dict[tuple[str, ...], int] = {}
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        if "model_id" not in (reader.fieldnames or ()):
            raise ManifestError(f"{csv_path}: no model_id column (its header: {', '.join(reader.fieldnames or ()) or 'empty'})")
        for n, rec in enumerate(reader, start=1):
            text = {k: (rec.get(k) or "").strip() or None for k in ("model_id", "task", *_CSV_COLUMNS)}
            key = tuple(v or "" for v in text.values())
            if key in seen:
                dropped.append((n, f"duplicate of csv row {seen[key]} ({text['model_id']} {text['task'] or ''})".rstrip()))
                continue
            seen[key] = n
            # the model type as the zoo tags it, for `manifest coverage` (a hub row has no config.json to read)
            model_type = (rec.get("model_type") or "").strip()
            tiny = "tiny" if rec.get("tiny_test_model") == "1" else None
            tags = [t for t in (rec.get("library"), tiny, f"model_type:{model_type}" if model_type else None) if t]
            rows.append({"source": text["model_id"], "task": text["task"], "tags": tags,
                         **{k: text[k] for k in _CSV_COLUMNS}})  # fmt: skip
            numbers.append(n)
    if rows:  # the manifest's own checks, row by row: a bad row is dropped here, not found by the run
        # a relative folder is the written manifest's neighbour, as read_manifest will resolve it
        checked = validate_table(_table(rows), base_dir=Path(out_path).parent.resolve(), path=Path(csv_path))
        bad = {p.row: p.reason for p in checked.problems if p.row is not None}
        dropped.extend((numbers[i - 1], reason) for i, reason in bad.items())
        rows = [row for i, row in enumerate(rows, start=1) if i not in bad]
    said = [f"csv row {n}: {reason}" for n, reason in sorted(dropped)]
    if not rows:  # a manifest without rows is one every run refuses: none is written
        raise ManifestError(f"{csv_path}: no row could be used ({len(said)} dropped: {'; '.join(said[:3])}"
                            f"{' ...' if len(said) > 3 else ''}); nothing written")  # fmt: skip
    write_manifest(rows, out_path)
    return len(rows), said

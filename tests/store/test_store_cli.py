"""`zoo-convert db ...` and `zoo-convert dashboard` through click's CliRunner on a real DB file."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from synthetic import fill

from zoo_convert.cli import cli


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("cli") / "results.duckdb"
    fill(path)
    return str(path)


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.output


def test_status_shows_the_latest_run(db: str) -> None:
    code, out = run("db", "status", "--db", db)
    assert code == 0
    lines = {line[:15].strip(): line[15:] for line in out.splitlines()}
    assert lines["run"] == "run-3" and lines["failure kinds"] == "export_error 1" and lines["regressions"] == "3"
    assert lines["converted"] == "0 of 1 models (fp32 verified)" and lines["not converted"] == "1"


def test_status_names_the_two_kinds_of_pass_apart(tmp_path: Path) -> None:
    """run-2 of the history: bert-a not converted (fp32 broke) while its fp16 and int8 verified; gpt2, roberta fine."""
    from synthetic import HISTORY, VERSIONS, good, result, variant

    from zoo_convert.store import ResultStore

    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r", manifest="m", manifest_hash="h", versions=VERSIONS, resources={}, settings={}, name="n-1")
    for key, res in HISTORY["run-2"][:3]:
        store.record("r", key, res)
    partial = result("zoo/wavlm", "wavlm", variants=(good("w")[0], variant("fp16", passed=False), good("w")[2]))
    store.record("r", "k-wavlm", partial)
    store.finish_run("r")
    code, out = run("db", "status", "--db", str(tmp_path / "r.duckdb"))
    assert code == 0 and out.splitlines()[0].split() == ["run", "n-1", "(r)"]
    assert "converted      3 of 4 models (fp32 verified)" in out
    assert "partial        1 (converted, a variant failed)" in out
    assert "not converted  1" in out and "variants       10 of 12 verified" in out


def test_regressions_exit_1_when_any(db: str) -> None:
    code, out = run("db", "regressions", "--db", db)
    assert code == 1 and out.count("broke") == 3 and "zoo/t5-d" in out
    code, out = run("db", "regressions", "--db", db, "--since", "run-1")
    assert code == 1 and "slower" in out and "error_grew" in out
    assert run("db", "regressions", "--db", db, "--since", "run-3") == (0, "no regressions\n")
    assert run("db", "regressions", "--db", db, "--since", "nope")[0] == 2


def test_regressions_since_a_name_or_a_date_and_what_changed(db: str) -> None:
    code, out = run("db", "regressions", "--db", db, "--since", "nightly-2026-01-02")
    assert code == 1 and out.count("broke") == 3 and "slower" not in out
    assert "onnxruntime 1.32.0 -> 1.33.0" in out
    code, out = run("db", "regressions", "--db", db, "--since", "run-1")
    run2 = [line for line in out.splitlines() if "slower" in line or "error_grew" in line]
    assert run2 and all(line.startswith("nightly-2026-01-02 ") for line in run2)
    assert all("same checkpoint and toolchain" in line for line in run2)
    # A slower row shows both figures it was judged on: ONNX Runtime 2 -> 3 ms, its PyTorch reference 5 -> 5 ms.
    header = out.splitlines()[0].split()
    assert header[header.index("previous_ort_p50_ms") : header.index("previous_ort_p50_ms") + 4] == [
        "previous_ort_p50_ms", "ort_p50_ms", "previous_torch_p50_ms", "torch_p50_ms"]  # fmt: skip
    slower = [line.split() for line in run2 if "slower" in line and "zoo/roberta-c" in line]
    assert len(slower) == 3 and all(cells[-4:] == ["2", "3", "5", "5"] for cells in slower)
    assert run("db", "regressions", "--db", db, "--since", "2000-01-01") == (1, out)  # run-1 has nothing to compare
    assert run("db", "regressions", "--db", db, "--since", "2999-01-01") == (0, "no regressions\n")


def test_query_is_read_only(db: str) -> None:
    code, out = run("db", "query", "--db", db, "SELECT model_type, pass_rate FROM compat_matrix WHERE variant = 'fp32'"
                                               " ORDER BY model_type")
    assert code == 0 and out.splitlines()[2].split() == ["bert", "0"]
    code, out = run("db", "query", "--db", db, "DELETE FROM runs")
    assert code == 2 and "read-only" in out


@pytest.mark.parametrize(
    "sql",
    [
        "COPY results TO '{out}/results.csv'",
        "EXPORT DATABASE '{out}/everything'",
        "SELECT * FROM read_text('{secret}')",
        "SELECT * FROM read_csv('{secret}')",
        "ATTACH '{out}/other.duckdb' AS other",
        "INSTALL httpfs",
        "SET enable_external_access = true",
    ],
    ids=["copy-to", "export-database", "read-text", "read-csv", "attach", "install", "turn-it-back-on"],
)
def test_query_touches_no_file_beside_the_db_and_installs_nothing(sql: str, db: str, tmp_path: Path) -> None:
    """`db query` refused writes, but COPY ... TO, EXPORT DATABASE, read_text('/etc/shadow') and INSTALL all worked."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$hash\n")
    out = tmp_path / "out"
    out.mkdir()
    code, output = run("db", "query", "--db", db, sql.format(out=out, secret=secret))
    assert code == 2 and "query failed: " in output, output
    assert "$6$hash" not in output and list(out.iterdir()) == []
    code, output = run("db", "query", "--db", db, "SELECT count(*) AS n FROM results")
    assert code == 0  # what it is for still works


def test_export_writes_parquet(db: str, tmp_path: Path) -> None:
    code, _ = run("db", "export", "--db", db, str(tmp_path))
    assert code == 0
    n = duckdb.sql(f"SELECT count(*) FROM '{tmp_path / 'results.parquet'}'").fetchall()[0][0]
    assert n == 27
    assert (tmp_path / "regressions.parquet").exists()


def test_dashboard_command_writes_the_site(db: str, tmp_path: Path) -> None:
    code, out = run("dashboard", "--db", db, "--out", str(tmp_path / "site"))
    assert code == 0 and (tmp_path / "site" / "index.html").exists() and "wrote" in out


def test_dashboard_never_deletes_files_that_are_no_earlier_dashboards(db: str, tmp_path: Path) -> None:
    """`dashboard --out` on an existing folder deleted the user's details/important.txt."""
    site = tmp_path / "site"
    assert run("dashboard", "--db", db, "--out", str(site))[0] == 0
    assert run("dashboard", "--db", db, "--out", str(site))[0] == 0  # an earlier dashboard: rebuilt in place
    (site / "details" / "important.txt").write_text("mine")
    code, out = run("dashboard", "--db", db, "--out", str(site))
    assert code == 2 and "holds files that are no dashboard's (details/important.txt)" in out, out
    assert (site / "details" / "important.txt").read_text() == "mine"
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.md").write_text("mine")
    (home / "index.html").write_text("<html>my own page</html>")
    code, out = run("dashboard", "--db", db, "--out", str(home))
    assert code == 2 and "(index.html, notes.md)" in out, out
    assert (home / "index.html").read_text() == "<html>my own page</html>"


@pytest.mark.parametrize("where", ["read-only", "under-a-file"])
def test_a_db_that_cannot_be_written_is_one_line_exit_1(where: str, tmp_path: Path, tiny_disk) -> None:
    """A DB on a read-only file system, or --db under a path that is a file: tracebacks from lock.py."""
    from zoo_convert.manifest import write_manifest

    manifest = write_manifest([{"source": "bad..id"}], tmp_path / "m.parquet")
    if where == "read-only":
        db = tiny_disk("ro") / "results.duckdb"
    else:
        (tmp_path / "a-file").write_text("")
        db = tmp_path / "a-file" / "results.duckdb"
    res = CliRunner().invoke(cli, ["run", str(manifest), "--db", str(db), "--out", str(tmp_path / "o")])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, res.output
    said = "Read-only file system" if where == "read-only" else f"{tmp_path / 'a-file'} is a file, not a folder"
    assert str(db) in res.output and said in res.output, res.output


def _damaged(tmp_path: Path, how: str) -> Path:
    """A results DB cut in half, or with bytes flipped in its data blocks (a checksum mismatch)."""
    path = tmp_path / f"{how}.duckdb"
    fill(path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        if how == "truncated":
            f.truncate(size // 2)
        else:
            for offset in range(3 * 262144 + 100, size, 262144):  # past the headers, into every later block
                f.seek(offset)
                block = f.read(64)
                f.seek(offset)
                f.write(bytes(b ^ 0xFF for b in block))
    return path


@pytest.mark.slow  # eight CLI processes
@pytest.mark.parametrize("how", ["truncated", "corrupt"])
@pytest.mark.parametrize("command", [["db", "status"], ["db", "export", "OUT"], ["dashboard", "--out", "OUT"], ["run", "MANIFEST"]])
def test_a_damaged_db_is_one_line_not_a_traceback(how: str, command: list[str], tmp_path: Path) -> None:
    from zoo_convert.manifest import write_manifest

    db = _damaged(tmp_path, how)
    manifest = write_manifest([{"source": "bad..id"}], tmp_path / "m.parquet")
    args = [str(tmp_path / "out") if a == "OUT" else str(manifest) if a == "MANIFEST" else a for a in command]
    res = CliRunner().invoke(cli, [*args, "--db", str(db)] + (["--out", str(tmp_path / "o")] if command[0] == "run" else []))
    assert res.exit_code != 0 and isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, res.output
    if command != ["db", "status"]:  # store/queries.py words its own errors ("query failed: ...")
        assert str(db) in res.output
    assert ("Could not read enough bytes" if how == "truncated" else "checksum") in res.output, res.output


LONG_SQL = ("SELECT source, message, versions, recorded_at, max_abs FROM results"
            " WHERE message LIKE 'Could not export%' ORDER BY job_seq")


def test_query_json_and_csv_keep_every_character(db: str) -> None:
    with duckdb.connect(db, read_only=True) as con:
        expected = con.execute(LONG_SQL).fetchall()
    assert expected and all(len(m) > 60 for _, m, *_ in expected)
    code, out = run("db", "query", "--db", db, "--format", "json", LONG_SQL)
    assert code == 0
    records = json.loads(out)
    assert [r["message"] for r in records] == [m for _, m, *_ in expected]
    assert records[0]["versions"]["torch"] == "2.13.0" and records[0]["recorded_at"].startswith("20")
    code, out = run("db", "query", "--db", db, "--format", "csv", LONG_SQL)
    assert code == 0
    parsed = list(csv.DictReader(io.StringIO(out)))
    assert [r["message"] for r in parsed] == [m for _, m, *_ in expected]
    assert json.loads(parsed[0]["versions"])["onnxruntime"] == "1.32.0"


def test_query_markdown_and_the_default_table(db: str) -> None:
    code, out = run("db", "query", "--db", db, "--format", "markdown",
                    "SELECT 'a|b' AS x, 1.5 AS y, NULL AS z, message FROM results WHERE message LIKE 'Could not%' LIMIT 1")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "| x | y | z | message |" and lines[1] == "|---|---|---|---|"
    assert lines[2].startswith("| a\\|b | 1.5 |  | Could not export") and "…" not in lines[2]
    code, out = run("db", "query", "--db", db, LONG_SQL)
    assert code == 0 and "…" in out  # the terminal table still cuts long cells
    assert run("db", "query", "--db", db, "--format", "xml", "SELECT 1")[0] == 2


def test_a_database_an_older_zoo_convert_wrote_is_refused_by_readers_until_db_migrate(tmp_path: Path) -> None:
    from zoo_convert.store.schema import LATEST_VERSION, MIGRATIONS, SCHEMA_MIGRATIONS

    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as con:  # what the version before the newest migration left
        con.execute(SCHEMA_MIGRATIONS)
        for m in MIGRATIONS[:-1]:
            con.execute(m.sql)
            con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", [m.version, m.name])
    code, out = run("db", "status", "--db", str(path))
    assert code == 1 and f"schema version {LATEST_VERSION - 1} < {LATEST_VERSION}" in out
    assert f"zoo-convert db migrate --db {path}" in out  # the message says what to run
    assert run("db", "migrate", "--db", str(path)) == (0, f"{path}: schema version {LATEST_VERSION} (was {LATEST_VERSION - 1})\n")
    assert run("db", "status", "--db", str(path)) == (0, "no runs yet\n")
    assert run("db", "migrate", "--db", str(path)) == (0, f"{path}: schema version {LATEST_VERSION} (already the latest)\n")
    with duckdb.connect(str(path)) as con:  # as a newer zoo_convert would leave it
        con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, 'from the future')", [LATEST_VERSION + 1])
    assert run("db", "migrate", "--db", str(path)) == (
        0, f"{path}: schema version {LATEST_VERSION + 1}, newer than this zoo_convert's {LATEST_VERSION}: nothing to do\n")
    assert run("db", "migrate", "--db", str(tmp_path / "typo.duckdb"))[0] == 2  # never makes a new database
    assert not (tmp_path / "typo.duckdb").exists()


def test_a_duckdb_file_that_is_not_a_results_database_is_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "sales.duckdb"  # someone's own database, a --db pointed at the wrong file
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE sales AS SELECT 1 AS x")
        con.execute("CREATE VIEW by_x AS SELECT x FROM sales")
    for args in (("db", "migrate"), ("db", "status")):
        code, out = run(*args, "--db", str(path))
        assert code == 1 and f"{path} is not a zoo_convert results database" in out, (args, out)
    with duckdb.connect(str(path), read_only=True) as con:  # migrate wrote nothing: none of our tables or views
        assert sorted(n for (n,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()) == ["by_x", "sales"]

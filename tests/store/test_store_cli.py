"""`zoo-convert db ...` and `zoo-convert dashboard` through click's CliRunner on a real DB file."""

from __future__ import annotations

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
    assert "run-3" in out and "export_error 1" in out and "regressions   3" in out


def test_regressions_exit_1_when_any(db: str) -> None:
    code, out = run("db", "regressions", "--db", db)
    assert code == 1 and out.count("broke") == 3 and "zoo/t5-d" in out
    code, out = run("db", "regressions", "--db", db, "--since", "run-1")
    assert code == 1 and "slower" in out and "error_grew" in out
    assert run("db", "regressions", "--db", db, "--since", "run-3") == (0, "no regressions\n")
    assert run("db", "regressions", "--db", db, "--since", "nope")[0] == 2


def test_query_is_read_only(db: str) -> None:
    code, out = run("db", "query", "--db", db, "SELECT model_type, pass_rate FROM compat_matrix WHERE variant = 'fp32'"
                                               " ORDER BY model_type")
    assert code == 0 and out.splitlines()[2].split() == ["bert", "0"]
    code, out = run("db", "query", "--db", db, "DELETE FROM runs")
    assert code == 2 and "read-only" in out


def test_export_writes_parquet(db: str, tmp_path: Path) -> None:
    code, _ = run("db", "export", "--db", db, str(tmp_path))
    assert code == 0
    n = duckdb.sql(f"SELECT count(*) FROM '{tmp_path / 'results.parquet'}'").fetchall()[0][0]
    assert n == 27
    assert (tmp_path / "regressions.parquet").exists()


def test_dashboard_command_writes_the_site(db: str, tmp_path: Path) -> None:
    code, out = run("dashboard", "--db", db, "--out", str(tmp_path / "site"))
    assert code == 0 and (tmp_path / "site" / "index.html").exists() and "wrote" in out


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

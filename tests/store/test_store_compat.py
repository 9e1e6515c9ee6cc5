"""The oldest DuckDB that pyproject.toml allows opens a farm DB written by today's, and runs the package itself.

That DuckDB is installed once with ``pip install --target`` under build/ (about 20 MB) and
imported by a subprocess through PYTHONPATH, so this environment's DuckDB stays as it is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from synthetic import fill

from zoo_convert.store.queries import EXPORTED

ROOT = Path(__file__).resolve().parents[2]
OLDEST = re.search(r'"duckdb>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)


@pytest.fixture(scope="session")
def oldest_duckdb() -> Path:
    """A folder holding duckdb==OLDEST alone, installed on first use."""
    target = ROOT / "build" / "test-deps" / f"duckdb-{OLDEST}"
    if not (target / "duckdb").is_dir():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(partial),
                        f"duckdb=={OLDEST}"], check=True, timeout=600)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target


def _run_with(duckdb_dir: Path, script: str) -> dict:
    """Run ``script`` (which prints one JSON line) with the given DuckDB ahead of this environment's."""
    paths = [str(duckdb_dir), str(ROOT), str(Path(__file__).parent)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["duckdb"] == OLDEST or out["duckdb"].startswith(OLDEST + "."), out
    return out


@pytest.mark.slow
def test_a_db_written_by_this_duckdb_opens_in_the_oldest_allowed(oldest_duckdb: Path, tmp_path: Path) -> None:
    path = tmp_path / "results.duckdb"
    store = fill(path)
    with store.connect() as con:
        expected = {name: con.execute(f"SELECT count(*) FROM {name}").fetchone()[0] for name in EXPORTED}
    out = _run_with(oldest_duckdb, f"""
        import json, duckdb
        con = duckdb.connect({str(path)!r}, read_only=True)
        counts = {{name: con.execute(f"SELECT count(*) FROM {{name}}").fetchone()[0] for name in {list(EXPORTED)!r}}}
        versions = con.execute("SELECT versions['torch'] FROM results LIMIT 1").fetchone()[0]
        print(json.dumps({{"duckdb": duckdb.__version__, "counts": counts, "torch": str(versions)}}))
    """)
    assert out["counts"] == expected and expected["results"] > 0 and expected["regressions"] > 0
    assert "2.13.0" in out["torch"]


@pytest.mark.slow
def test_the_package_runs_on_the_oldest_allowed_duckdb(oldest_duckdb: Path, tmp_path: Path) -> None:
    out = _run_with(oldest_duckdb, f"""
        import json, duckdb
        from synthetic import fill
        from zoo_convert.dashboard.site import build_site
        from zoo_convert.store import ResultStore
        from zoo_convert.store.queries import regressions, status
        fill({str(tmp_path / "results.duckdb")!r})
        store = ResultStore({str(tmp_path / "results.duckdb")!r}, read_only=True)
        index = build_site(store.path, {str(tmp_path / "site")!r})
        print(json.dumps({{"duckdb": duckdb.__version__, "jobs": status(store)["jobs"],
                          "regressions": len(regressions(store, "run-1")[1]), "site": index.stat().st_size}}))
    """)
    assert out["jobs"] == 1 and out["regressions"] > 0 and out["site"] > 10_000

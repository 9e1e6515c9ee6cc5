"""The README's demo command, killed with SIGKILL mid-run and started again: every job ends with exactly one result."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from zoo_convert import zoo
from zoo_convert.manifest import read_manifest
from zoo_convert.farm.plan import keyed_jobs
from zoo_convert.records import Settings

pytestmark = pytest.mark.slow  # the demo run through Ray, killed and resumed

REPO = Path(__file__).resolve().parents[1]
BIN = str(Path(sys.executable).parent)


def demo_run_command() -> list[str]:
    """The Makefile's ``demo`` run line, with $(BIN) and $(OUT) filled in."""
    line = next(ln for ln in (REPO / "Makefile").read_text().splitlines() if "zoo-convert run " in ln)
    line = line.strip().replace("$(BIN)", BIN).replace("$(OUT)", "build/demo")
    assert re.search(r"run build/demo/zoo/manifest.parquet --db build/demo/results.duckdb", line), line
    return shlex.split(line) + ["--num-cpus", "2"]


def test_demo_run_resumes_after_sigkill(tmp_path: Path) -> None:
    names = ("bert", "vit", "resnet", "roberta")
    manifest = zoo.build(tmp_path / "build/demo/zoo", names)
    db = tmp_path / "build/demo/results.duckdb"
    cmd = demo_run_command()

    # its own session, so the local Ray instance it starts can be cleaned up with it
    first = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    try:
        assert first.stdout is not None
        for line in first.stdout:
            if line.startswith("[1/"):
                break
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.wait()
        try:
            os.killpg(first.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(DISTINCT job_key) FROM results").fetchone()[0] < len(names)

    second = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=500, start_new_session=True)
    assert second.returncode == 0, second.stderr[-2000:]
    third = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0 and "nothing to do" in third.stdout
    assert "Started a local Ray instance" not in third.stderr

    expected = {j.key for j in keyed_jobs(read_manifest(manifest).entries, Settings())[0]}
    with duckdb.connect(str(db), read_only=True) as con:
        keys = con.execute("SELECT job_key, count(DISTINCT run_id), any_value(job_status) FROM results GROUP BY 1").fetchall()
        runs = con.execute("SELECT status FROM runs ORDER BY run_seq").fetchall()
    assert {k for k, _, _ in keys} == expected
    assert all(n_runs == 1 for _, n_runs, _ in keys)
    assert all(status == "passed" for _, _, status in keys)
    assert [r[0] for r in runs] == ["abandoned", "completed", "completed"]  # the killed run, as the next one found it

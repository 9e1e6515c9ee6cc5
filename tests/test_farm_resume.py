"""The driver killed with SIGKILL mid-run, then started again: every job ends with exactly one result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import duckdb

from zoo_convert.manifest import read_manifest, write_manifest
from zoo_convert.plan import keyed_jobs
from zoo_convert.records import Settings

ZOO_CONVERT = str(Path(sys.executable).with_name("zoo-convert"))


def test_resume_after_sigkill(zoo_dir: Path, tmp_path: Path) -> None:
    names = ("bert", "vit", "resnet", "roberta", "gpt2")
    manifest = write_manifest([{"source": str(zoo_dir / n), "variants": ["fp32"]} for n in names], tmp_path / "m.parquet")
    db, out = tmp_path / "r.duckdb", tmp_path / "out"
    cmd = [ZOO_CONVERT, "run", str(manifest), "--db", str(db), "--out", str(out), "--num-cpus", "2"]

    # its own session, so the local Ray instance it starts can be cleaned up with it
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
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

    second = subprocess.run(cmd, capture_output=True, text=True, timeout=400, start_new_session=True)
    assert second.returncode == 0, second.stderr[-2000:]
    third = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0 and "nothing to do" in third.stdout
    assert "Started a local Ray instance" not in third.stderr

    expected = {j.key for j in keyed_jobs(read_manifest(manifest).entries, Settings())}
    with duckdb.connect(str(db), read_only=True) as con:
        keys = con.execute("SELECT job_key, count(DISTINCT run_id), any_value(job_status) FROM results GROUP BY 1").fetchall()
        runs = con.execute("SELECT status FROM runs ORDER BY run_seq").fetchall()
    assert {k for k, _, _ in keys} == expected
    assert all(n_runs == 1 for _, n_runs, _ in keys)
    assert all(status == "passed" for _, _, status in keys)
    assert [r[0] for r in runs] == ["running", "completed", "completed"]  # the killed run never finished

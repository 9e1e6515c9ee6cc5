"""The run's own Ray DashboardAgent killed mid-run: the raylet dies with it; the run stops, and the next redoes its jobs.

Issue 23: "the run's own Ray DashboardAgent killed: the raylet dies with it, 5 of 6 jobs recorded worker_lost
after 10 retries, exit 0." A real ``zoo-convert run`` in a subprocess, its agent found among its raylet's
children (/proc) and killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from zoo_convert.errors import FailureKind
from zoo_convert.manifest import write_manifest

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # two real runs on Ray; the run must stop within 60 s

BIN = Path(sys.executable).parent
MODELS = ("bert", "albert", "electra")


def _children(pid: int) -> dict[int, str]:
    """Every descendant of ``pid``: its pid and command line (/proc; its title for a Ray process that set one)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = {}, [pid]
    while frontier:
        here = frontier.pop()
        for child, parent in parents.items():
            if parent == here:
                try:
                    found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                frontier.append(child)
    return found


def _agent_of(run: subprocess.Popen[str], timeout: float) -> int:
    """The pid of the run's DashboardAgent, once one of its jobs is running (a worker holds a ``convert`` task)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert run.poll() is None, "the run ended before its jobs started"
        procs = _children(run.pid)
        agents = [p for p, cmd in procs.items() if "DashboardAgent" in cmd or "dashboard/agent.py" in cmd]
        if agents and any(cmd.startswith("ray::") and ("convert" in cmd or "_job_task" in cmd) for cmd in procs.values()):
            return agents[0]
        time.sleep(0.2)
    raise AssertionError(f"no DashboardAgent with a running job under the run after {timeout:g} s")


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from zoo_convert import zoo

    return zoo.build(tmp_path_factory.mktemp("zoo"), list(MODELS)).parent


def test_a_killed_dashboard_agent_stops_the_run_and_the_next_run_redoes_its_jobs(tiny_zoo: Path, tmp_path: Path) -> None:
    zoo_rows = pq.read_table(tiny_zoo / "manifest.parquet").to_pylist()
    rows = [{**r, "source": str(tiny_zoo / r["source"]), "variants": ["fp32"]} for r in zoo_rows]
    manifest = write_manifest(rows, tmp_path / "m.parquet")
    db, out = tmp_path / "r.duckdb", tmp_path / "out"
    cmd = [str(BIN / "zoo-convert"), "run", str(manifest), "--db", str(db), "--out", str(out), "--num-cpus", "2",
           "--no-benchmark", "--no-long-shape", "--no-generation"]  # fmt: skip
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        agent = _agent_of(run, timeout=120)
        os.kill(agent, signal.SIGKILL)
        killed = time.monotonic()
        output, _ = run.communicate(timeout=120)
        stopped_after = time.monotonic() - killed
        print(f"the run ended {stopped_after:.1f} s after its DashboardAgent was killed")
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode != 0, output
    # main: each job retried with backoff on a node that is gone (the issue: 10 retries, then exit 0)
    assert stopped_after < 60, (stopped_after, output)
    assert "stopped: this machine's Ray raylet died" in output, output
    machine = {k.value for k in FailureKind if not k.terminal}
    with duckdb.connect(str(db), read_only=True) as con:
        recorded = con.execute("SELECT source, status, failure_kind FROM results").fetchall()
    verdicts = [r for r in recorded if r[1] != "passed" and r[2] not in machine]
    assert not verdicts, (verdicts, output)

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        latest = con.execute("SELECT source, arg_max(status, job_seq) FROM results GROUP BY source").fetchall()
    assert sorted(latest) == sorted((str(tiny_zoo / name), "passed") for name in MODELS), (latest, again.stdout)

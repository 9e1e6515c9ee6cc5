"""One run per database: `zoo-convert run` against a DB another run holds stops, waits, or takes a dead holder's lock."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pytest

from zoo_convert.errors import RunLockedError
from zoo_convert.manifest import write_manifest
from zoo_convert.store import ResultStore
from zoo_convert.store.lock import run_lock

BIN = Path(sys.executable).parent

# Another run, as far as the lock is concerned: holds the DB's run lock until killed.
_HOLDER = """
import sys, time
from zoo_convert.store.lock import run_lock
with run_lock(sys.argv[1], "run-A"):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path: Path):
    db = tmp_path / "results.duckdb"
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(db)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def _run(tmp_path: Path, *extra: str) -> list[str]:
    # one invalid row: the run records it without Ray, so a whole run costs a second or two
    manifest = write_manifest([{"source": "bad..id"}], tmp_path / "m.parquet")
    db = tmp_path / "results.duckdb"
    return [str(BIN / "zoo-convert"), "run", str(manifest), "--db", str(db), "--out", str(tmp_path / "out"), *extra]


def test_a_second_run_stops_at_once_saying_who_holds_the_db(tmp_path: Path, holder: subprocess.Popen) -> None:
    t0 = time.monotonic()
    second = subprocess.run(_run(tmp_path), capture_output=True, text=True, timeout=120)
    assert second.returncode == 2 and time.monotonic() - t0 < 60
    said = " ".join(second.stderr.split())
    assert f"run run-A (host {socket.gethostname()}, pid {holder.pid}, since 20" in said and "--wait" in said, said
    assert "Traceback" not in second.stderr
    assert not (tmp_path / "results.duckdb").exists()  # it stopped before touching the DB


def test_the_library_refuses_too(tmp_path: Path, holder: subprocess.Popen) -> None:
    with pytest.raises(RunLockedError, match="run run-A") as refused:
        with run_lock(tmp_path / "results.duckdb", "run-B"):
            pass
    assert f"pid {holder.pid}" in str(refused.value.holder)


def test_wait_starts_once_the_holder_is_gone_and_a_killed_run_is_marked_abandoned(
    tmp_path: Path, holder: subprocess.Popen
) -> None:
    db = tmp_path / "results.duckdb"
    # a run whose driver was SIGKILLed: its row says "running" for ever
    ResultStore(db).start_run("run-killed", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    waiting = subprocess.Popen(_run(tmp_path, "--wait"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert waiting.stderr is not None
    line = waiting.stderr.readline()
    assert "run run-A" in line and "waiting" in line, line
    assert waiting.poll() is None  # still waiting
    released_at = datetime.now(timezone.utc).replace(tzinfo=None)  # the DB's clock: naive UTC
    os.kill(holder.pid, signal.SIGKILL)  # the holder dies without letting go: the kernel does
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    with duckdb.connect(str(db), read_only=True) as con:
        runs = con.execute("SELECT run_id, status, started_at FROM runs ORDER BY run_seq").fetchall()
        recorded = con.execute("SELECT count(*) FROM results").fetchone()[0]
    assert runs[0][:2] == ("run-killed", "abandoned") and runs[1][1] == "completed" and recorded == 1
    assert runs[1][2] >= released_at  # it waited: its run began only once the holder was gone


def test_a_finished_run_leaves_the_lock_free_for_the_next(tmp_path: Path) -> None:
    assert subprocess.run(_run(tmp_path), capture_output=True, timeout=120).returncode == 0
    assert subprocess.run(_run(tmp_path, "--force"), capture_output=True, timeout=120).returncode == 0
    with duckdb.connect(str(tmp_path / "results.duckdb"), read_only=True) as con:
        assert con.execute("SELECT list(status ORDER BY run_seq) FROM runs").fetchone()[0] == ["completed", "completed"]

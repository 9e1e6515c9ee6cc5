"""`zoo-convert run` as a user runs it (a subprocess, real Ray): a named run, its summary, and what stays out of it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zoo_convert import zoo
from zoo_convert.manifest import SCHEMA

pytestmark = pytest.mark.slow  # `zoo-convert run` starts Ray

EXE = str(Path(sys.executable).with_name("zoo-convert"))
NAME = "nightly-2026-01-01"


@dataclass(frozen=True)
class NamedRun:
    db: Path
    manifest: Path
    out: Path
    proc: subprocess.CompletedProcess


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    # Without --address, ray.init() joins a cluster that `ray start` left on this machine (another test's);
    # "local" makes this run start its own instance, as on a clean machine.
    env = {**os.environ, "RAY_ADDRESS": "local"}
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout, check=False, env=env)


@pytest.fixture(scope="module")
def named_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamedRun]:
    """bert and a folder without config.json, run once with --name."""
    root = tmp_path_factory.mktemp("named")
    zoo.build(root / "zoo", only=["bert"])
    (root / "zoo" / "broken").mkdir()
    rows = pq.read_table(root / "zoo" / "manifest.parquet").to_pylist()
    rows.append({**rows[0], "source": "broken", "task": None})
    manifest = root / "zoo" / "two.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), manifest)
    db, out = root / "results.duckdb", root / "artifacts"
    proc = _cli("run", str(manifest), "--db", str(db), "--out", str(out), "--name", NAME, "--no-optimize",
                "--no-benchmark", "--num-cpus", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield NamedRun(db, manifest, out, proc)


def test_the_run_names_itself_and_lists_its_failures(named_run: NamedRun) -> None:
    lines = named_run.proc.stdout.splitlines()
    assert "starting Ray (a local instance takes 10-20 s) ..." in lines  # before the first job: Ray takes a while
    assert lines[0].startswith(f"run {NAME} (") and "2 to do" in lines[0]
    assert any(line.startswith(f"run {NAME} (") and "2 recorded" in line for line in lines)
    assert "  converted  1 of 2 models (fp32 verified), 0 partial (a variant failed)" in lines
    assert "  variants   3 of 3 verified" in lines
    failed = lines[lines.index("failed (1):") + 1:]
    assert len(failed) == 1 and failed[0].split()[:3] == [str(named_run.manifest.parent / "broken"), "fetch_error",
                                                          "fetch"]
    assert "config.json" in failed[0]


def test_ray_and_hub_chatter_stays_out_of_the_output(named_run: NamedRun) -> None:
    text = named_run.proc.stdout + named_run.proc.stderr
    assert "Token authentication" not in text and "Started a local Ray instance" not in text
    assert "it/s]" not in text and "Fetching" not in text


def test_a_taken_name_stops_the_run_before_it_starts(named_run: NamedRun) -> None:
    proc = _cli("run", str(named_run.manifest), "--db", str(named_run.db), "--out", str(named_run.out),
                "--name", NAME, "--force")
    assert proc.returncode == 2 and f"run name '{NAME}' is taken" in proc.stderr
    assert "to do" not in proc.stdout


def test_names_that_would_be_ambiguous_are_refused(named_run: NamedRun) -> None:
    for bad, why in (("2026-01-02", "reads as a date"), ("two words", "use up to 100"), ("-x", "use up to 100")):
        proc = _cli("run", str(named_run.manifest), "--db", str(named_run.db), "--out", str(named_run.out),
                    f"--name={bad}", "--force")
        assert proc.returncode == 2 and why in proc.stderr, (bad, proc.stderr)


def test_status_and_regressions_know_the_name(named_run: NamedRun) -> None:
    proc = _cli("db", "status", "--db", str(named_run.db))
    assert proc.returncode == 0 and proc.stdout.splitlines()[0].split()[:2] == ["run", NAME]
    assert "converted      1 of 2 models (fp32 verified)" in proc.stdout
    # the README's and --help's own example
    assert _cli("db", "regressions", "--db", str(named_run.db), "--since", NAME).stdout == "no regressions\n"
    assert _cli("db", "regressions", "--db", str(named_run.db), "--since", "2026-01-01").returncode == 0
    proc = _cli("db", "regressions", "--db", str(named_run.db), "--since", "nightly-2025-12-31")
    assert proc.returncode == 2 and "no run has that name or id" in proc.stderr


def test_a_run_ended_by_sigterm_is_marked_interrupted(tmp_path: Path) -> None:
    """Ctrl-C marked a run interrupted; `kill` (SIGTERM) left it running until the next run called it abandoned."""
    import signal
    import time

    import duckdb

    # enough jobs, one at a time, that the run is still going when the signal comes (three tiny ones could all
    # finish within the two seconds after the run's row appeared)
    manifest = zoo.build(tmp_path / "zoo", only=["bert", "gpt2", "vit", "t5", "whisper", "roberta", "llama", "bart"])
    db = tmp_path / "results.duckdb"
    proc = subprocess.Popen(
        [EXE, "run", str(manifest), "--db", str(db), "--out", str(tmp_path / "out"), "--num-cpus", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "RAY_ADDRESS": "local"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:  # the run's row is written once Ray is up
            try:
                with duckdb.connect(str(db), read_only=True) as con:
                    if con.execute("SELECT count(*) FROM runs").fetchone() == (1,):
                        break
            except duckdb.Error:  # not there yet, or being written
                pass
            time.sleep(0.5)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the Ray instance it started
        except ProcessLookupError:
            pass
    assert proc.returncode != 0, out
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("interrupted",)], out
        assert con.execute("SELECT count(DISTINCT source) FROM results").fetchone()[0] < 8, out

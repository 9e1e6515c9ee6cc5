"""The farm on a local Ray instance: fault jobs, bad rows, retries, and an unchanged rerun that skips everything."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pytest

from zoo_convert.errors import FailureKind
from zoo_convert.farm.driver import FarmOptions, run_farm
from zoo_convert.farm.isolation import failure_result
from zoo_convert.manifest import write_manifest
from zoo_convert.pipeline import StageCallback, convert_one
from zoo_convert.records import ConversionResult, ManifestEntry, Settings

pytestmark = pytest.mark.slow  # every test here starts Ray

BIN = Path(sys.executable).parent


def misbehave(entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None) -> ConversionResult:
    """The farm's job function for these tests: faults for named sources, the real pipeline otherwise."""
    name = Path(entry.source).name
    if name == "hang":
        time.sleep(3600)
    elif name == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif name == "hog":
        chunks = []
        while True:
            chunks.append(bytearray(64 * 2**20))
    elif name.startswith("lost"):  # as when the raylet died with the DashboardAgent: every task's worker is lost
        return failure_result(entry, FailureKind.WORKER_LOST, "simulated: the worker died unexpectedly")
    elif name == "flaky":
        marker = Path(settings.out_dir, "flaky.failed-once")
        if not marker.exists():
            marker.write_text("")
            return failure_result(entry, FailureKind.FETCH_TRANSIENT, "simulated network error while fetching")
    return convert_one(entry, settings, on_stage=on_stage)


def test_faults_are_recorded_with_their_kind_and_the_rest_converts(
    local_ray: None, zoo_dir: Path, tmp_path: Path
) -> None:
    for name in ("hang", "segv", "hog", "flaky"):
        shutil.copytree(zoo_dir / "bert", tmp_path / name)
    fp32 = ["fp32"]
    rows = [
        {"source": str(zoo_dir / "bert"), "task": "fill-mask", "variants": fp32},
        {"source": str(zoo_dir / "resnet"), "variants": fp32, "priority": 9},
        {"source": "hang", "variants": fp32, "timeout_s": 3.0},
        {"source": "segv", "variants": fp32},
        {"source": "hog", "variants": fp32, "memory_gb": 1.5},
        {"source": "flaky", "task": "fill-mask", "variants": fp32},
        {"source": "bad..id"},
        {"source": "flaky", "task": "not-a-task"},
    ]
    manifest = write_manifest(rows, tmp_path / "m.parquet")
    db = tmp_path / "r.duckdb"
    settings = Settings(out_dir=str(tmp_path / "out"), bench_warmup=0, bench_runs=2, timeout_s=300)
    options = FarmOptions(max_attempts=2, backoff_s=0.1)

    report = run_farm(manifest, db_path=db, settings=settings, options=options, job_fn=misbehave)
    assert report.recorded == 8 and report.ray_started

    with duckdb.connect(str(db), read_only=True) as con:
        rows_by_source = con.execute(
            "SELECT manifest_row, any_value(job_status), any_value(failure_kind), any_value(attempts),"
            " any_value(message), count(DISTINCT job_key) FROM results GROUP BY manifest_row ORDER BY 1"
        ).fetchall()
    got = {r[0]: r[1:] for r in rows_by_source}
    assert got[1][:3] == ("passed", None, 1)
    assert got[2][:3] == ("passed", None, 1)
    assert got[3][1:3] == ("timeout", 1)
    assert got[4][1:3] == ("crash", 1)
    assert got[5][1:3] == ("oom", 2)  # transient: retried once, then recorded
    assert got[6][:3] == ("passed", None, 2)
    assert got[7][1] == "manifest_error" and "'..'" in got[7][3]
    assert got[8][1] == "manifest_error" and "unknown task 'not-a-task'" in got[8][3]
    assert all(r[-1] == 1 for r in got.values())

    # an unchanged manifest: nothing to do, and Ray is not needed for it
    again = run_farm(manifest, db_path=db, settings=settings, options=options, job_fn=misbehave)
    assert (again.recorded, again.skipped, again.ray_started) == (0, 8, False)


def _planted_tmpdir() -> Path:
    """A TMPDIR whose fork-server folder another user could have made: open to everyone.

    Short (a unix socket path must stay under 108 bytes) and never the machine's own /tmp,
    whose fork server the other tests and processes share.
    """
    tmpdir = Path(tempfile.mkdtemp(prefix="zc-"))
    planted = tmpdir / f"zoo-convert-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    return tmpdir


def _one_row_manifest(tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "bert"}')
    return write_manifest([{"source": str(ckpt)}], tmp_path / "m.parquet")


def _recorded(db: Path) -> tuple[int, list[str]]:
    with duckdb.connect(str(db), read_only=True) as con:
        results = con.execute("SELECT count(*) FROM results").fetchone()[0]
        runs = [s for (s,) in con.execute("SELECT status FROM runs ORDER BY run_seq").fetchall()]
    return results, runs


def test_an_unsafe_fork_server_folder_stops_the_run_before_any_job(tmp_path: Path) -> None:
    tmpdir = _planted_tmpdir()
    try:
        manifest, db = _one_row_manifest(tmp_path), tmp_path / "r.duckdb"
        run = subprocess.run(
            [str(BIN / "zoo-convert"), "run", str(manifest), "--db", str(db), "--out", str(tmp_path / "out"), "--num-cpus", "1"],
            env={**os.environ, "TMPDIR": str(tmpdir)}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode != 0, run.stdout
        assert f"{tmpdir}/zoo-convert-{os.getuid()} has mode 0777" in run.stderr and "Traceback" not in run.stderr
        assert "Started a local Ray instance" not in run.stderr
        assert _recorded(db) == (0, [])  # no job ran, none is recorded as the model's failure
    finally:
        shutil.rmtree(tmpdir)


_ON_A_CLUSTER = """
import sys, ray
from zoo_convert.errors import UnsafeForkServerError
from zoo_convert.farm.driver import run_farm
from zoo_convert.records import Settings
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
try:
    run_farm(sys.argv[1], db_path=sys.argv[2], settings=Settings(out_dir=sys.argv[3]))
except UnsafeForkServerError as exc:
    print("stopped:", exc.folder)
"""


def test_an_unsafe_fork_server_folder_on_a_worker_node_stops_the_run(tmp_path: Path) -> None:
    """The driver joins a running cluster (no fork server of its own): the first worker to refuse stops it."""
    tmpdir = _planted_tmpdir()
    try:
        manifest, db = _one_row_manifest(tmp_path), tmp_path / "r.duckdb"
        run = subprocess.run(
            [sys.executable, "-c", _ON_A_CLUSTER, str(manifest), str(db), str(tmp_path / "out")],
            env={**os.environ, "TMPDIR": str(tmpdir)}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert f"stopped: {tmpdir}/zoo-convert-{os.getuid()}" in run.stdout, run.stderr[-3000:]
        assert _recorded(db) == (0, ["failed"])
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def test_unreadable_checkpoints_and_gpu_rows_on_a_cpu_cluster_are_results_and_the_rest_converts(
    local_ray: None, zoo_dir: Path, tmp_path: Path, poison
) -> None:
    fp32 = ["fp32"]
    rows = [{"source": str(zoo_dir / "bert"), "task": "fill-mask", "variants": fp32}]
    for how in ("proc-mem", "dangling", "folder"):
        shutil.copytree(zoo_dir / "bert", tmp_path / how)
        rows.append({"source": str(poison(tmp_path / how, how)), "variants": fp32})
    rows += [{"source": str(zoo_dir / "bert"), "task": "feature-extraction", "variants": fp32, "gpu": True}]
    manifest = write_manifest(rows, tmp_path / "m.parquet")
    db = tmp_path / "r.duckdb"
    settings = Settings(out_dir=str(tmp_path / "out"), benchmark=False, timeout_s=300)

    report = run_farm(manifest, db_path=db, settings=settings)
    assert report.recorded == 5
    with duckdb.connect(str(db), read_only=True) as con:
        got = dict(con.execute("SELECT manifest_row, (job_status, failure_kind, message) FROM results").fetchall())
    assert got[1][:2] == ("passed", None)
    assert got[2][1] == "fetch_error" and "notes.txt" in got[2][2], got[2]
    assert got[3][1] == "fetch_error" and "dangling.safetensors" in got[3][2], got[3]
    assert got[4][1] == "fetch_error" and "folder.safetensors is not a regular file" in got[4][2], got[4]
    assert got[5][1] == "gpu_unavailable", got[5]

    # the unreadable rows are answered; the GPU row is the cluster's problem, asked again next time
    again = run_farm(manifest, db_path=db, settings=settings)
    assert (again.recorded, again.skipped, dict(again.by_kind)) == (1, 4, {"gpu_unavailable": 1})


def test_a_timeout_is_redone_only_when_the_timeout_grows(local_ray: None, zoo_dir: Path, tmp_path: Path) -> None:
    shutil.copytree(zoo_dir / "bert", tmp_path / "hang")
    fp32 = ["fp32"]
    rows = [{"source": "hang", "variants": fp32}, {"source": str(zoo_dir / "bert"), "task": "fill-mask", "variants": fp32}]
    manifest = write_manifest(rows, tmp_path / "m.parquet")
    db = tmp_path / "r.duckdb"

    def run(timeout_s: float) -> tuple[int, int]:
        settings = Settings(out_dir=str(tmp_path / "out"), benchmark=False, timeout_s=timeout_s)
        report = run_farm(manifest, db_path=db, settings=settings, job_fn=misbehave)
        return report.recorded, report.skipped

    # long enough for the real conversion beside it on a loaded machine
    assert run(8.0) == (2, 0)
    assert run(8.0) == (0, 2)  # the same limit: the timeout answers the job
    assert run(4.0) == (0, 2)  # a shorter one: still answered, nothing else is redone either
    assert run(10.0) == (1, 1)  # longer: only the job that timed out runs again
    with duckdb.connect(str(db), read_only=True) as con:
        got = con.execute("SELECT job_status, failure_kind, timeout_s FROM results ORDER BY job_seq").fetchall()
    assert sorted(got[:2]) == [("failed", "timeout", 8.0), ("passed", None, 8.0)] and got[2:] == [("failed", "timeout", 10.0)]


def test_a_full_disk_is_retried_and_redone_by_the_next_run(local_ray: None, zoo_dir: Path, tmp_path: Path, tiny_disk) -> None:
    out = tiny_disk("size=64k")
    manifest = write_manifest([{"source": str(zoo_dir / "bert"), "task": "fill-mask", "variants": ["fp32"]}], tmp_path / "m.parquet")
    db = tmp_path / "r.duckdb"
    settings = Settings(out_dir=str(out), benchmark=False, timeout_s=300)
    options = FarmOptions(max_attempts=2, backoff_s=0.1)

    full = run_farm(manifest, db_path=db, settings=settings, options=options)
    assert (full.recorded, full.retries, dict(full.by_kind)) == (1, 1, {"storage_error": 1})
    subprocess.run(["mount", "-o", "remount,size=64m", str(out)], check=True)  # room made
    fixed = run_farm(manifest, db_path=db, settings=settings, options=options)
    assert (fixed.recorded, fixed.skipped, fixed.by_status["passed"]) == (1, 0, 1)


def test_a_run_whose_every_job_meets_the_same_machine_fault_stops_and_the_next_run_redoes_them(
    local_ray: None, tmp_path: Path
) -> None:
    """5 of 6 jobs were recorded worker_lost after 10 retries, exit 0, and the next run said nothing to do."""
    from zoo_convert.manifest import read_manifest
    from zoo_convert.farm.plan import make_plan
    from zoo_convert.store.db import ResultStore

    for i in range(5):
        (tmp_path / f"lost{i}").mkdir()
        (tmp_path / f"lost{i}" / "config.json").write_text('{"model_type": "bert"}')
    manifest = write_manifest([{"source": str(tmp_path / f"lost{i}"), "task": "fill-mask"} for i in range(5)],
                              tmp_path / "m.parquet")  # fmt: skip
    db = tmp_path / "r.duckdb"
    options = FarmOptions(max_attempts=2, backoff_s=0.1, max_in_flight=1)
    report = run_farm(manifest, db_path=db, settings=Settings(out_dir=str(tmp_path / "out")), options=options,
                      job_fn=misbehave)  # fmt: skip
    assert report.stopped is not None and "3 jobs in a row met worker_lost" in report.stopped, report.stopped
    assert "2 jobs left for the next run" in report.stopped
    assert (report.recorded, dict(report.by_kind)) == (3, {"worker_lost": 3})  # tried, not a verdict
    with ResultStore(db) as store:
        with store.connect() as con:
            assert con.execute("SELECT status FROM runs").fetchall() == [("stopped",)]
        plan = make_plan(read_manifest(manifest), Settings(), store.terminal_keys(), latest=store.latest_keys())
    assert len(plan.jobs) == 5  # all of them again, without --retry-failed

"""The farm on a local Ray instance: fault jobs, bad rows, retries, and an unchanged rerun that skips everything."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
import ray

from zoo_convert.errors import FailureKind
from zoo_convert.farm import FarmOptions, run_farm
from zoo_convert.isolation import failure_result
from zoo_convert.manifest import write_manifest
from zoo_convert.pipeline import StageCallback, convert_one
from zoo_convert.records import ConversionResult, ManifestEntry, Settings

TESTS = Path(__file__).resolve().parent


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
    elif name == "flaky":
        marker = Path(settings.out_dir, "flaky.failed-once")
        if not marker.exists():
            marker.write_text("")
            return failure_result(entry, FailureKind.FETCH_TRANSIENT, "simulated network error while fetching")
    return convert_one(entry, settings, on_stage=on_stage)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    # workers import this module to unpickle misbehave
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), old) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = old


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

"""A big manifest costs the farm what its distinct jobs cost: bad rows, duplicates and reruns in bounded output and time.

Issue 23: "A 100,000-row manifest with 50,000 duplicates and 2 real jobs: the run took 424 s, printed 100,027
lines and held the DB lock throughout." benchmarks/bench_manifest.py --run measures that run; these check the
behaviour on 5,000 rows without starting Ray (no row here is a job to run).
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import duckdb
import pytest

from zoo_convert.errors import ManifestError, RunLockedError
from zoo_convert.farm.driver import MAX_LISTED, FarmOptions, Progress, run_farm
from zoo_convert.manifest import write_manifest
from zoo_convert.records import Settings
from zoo_convert.store.lock import run_lock

ROWS = 5_000


@pytest.mark.slow  # 9 s on the shared 2-core machine (main: 90 s)
def test_5000_bad_rows_are_all_recorded_in_a_bounded_number_of_lines_and_a_rerun_is_one_line(tmp_path: Path) -> None:
    """Each bad row is a manifest_error result, but the run's output names only the first few (main: a line each,
    and one DB query and one INSERT per row: minutes)."""
    rows = [{"source": f"org{i % 97}/model-{i:05d}", "opsets": [99]} for i in range(ROWS)]
    path = write_manifest(rows, tmp_path / "m.parquet")
    db, settings = tmp_path / "r.duckdb", Settings(out_dir=str(tmp_path / "out"))
    out = io.StringIO()
    t0 = time.monotonic()
    report = run_farm(path, db_path=db, settings=settings, progress=Progress(out, live=False))
    seconds = time.monotonic() - t0
    lines = out.getvalue().splitlines()
    assert not report.ray_started and report.recorded == ROWS and report.by_kind == {"manifest_error": ROWS}
    per_row = [line for line in lines if line.startswith("[")]
    assert len(per_row) == MAX_LISTED and per_row[-1].startswith(f"[{MAX_LISTED}/{ROWS}] failed manifest_error")
    assert f"... and {ROWS - MAX_LISTED} more invalid rows recorded as manifest_error" in out.getvalue()
    assert len(lines) < 3 * MAX_LISTED + 10, lines[:5]
    # every row recorded, once, with its own reason
    with duckdb.connect(str(db), read_only=True) as con:
        got = con.execute("SELECT count(*), count(DISTINCT job_key), count(DISTINCT manifest_row), min(message)"
                          " FROM results").fetchone()  # fmt: skip
    assert got == (ROWS, ROWS, ROWS, "impossible opset (supported: 7..23): [99]")
    assert seconds < 60, seconds  # main: ~5-15 ms per row in executemany and a query per row, i.e. minutes

    again = io.StringIO()
    rerun = run_farm(path, db_path=db, settings=settings, progress=Progress(again, live=False))
    assert (rerun.recorded, rerun.skipped) == (0, ROWS)
    assert again.getvalue().splitlines() == [f"nothing to do: all {ROWS} jobs already have a result"
                                             " (use --force or --retry-failed)"]  # fmt: skip


def test_a_manifest_is_read_and_checked_before_the_run_lock(tmp_path: Path) -> None:
    """A broken manifest is said as such while another run holds the DB (main: 'in use by ...', the lock first),
    and a second run waits only for the lock, never for the first to read its manifest."""
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    db = tmp_path / "r.duckdb"
    settings = Settings(out_dir=str(tmp_path / "out"))
    good = write_manifest([{"source": "org/m", "opsets": [99]}], tmp_path / "m.parquet")
    with run_lock(db, "holder"):
        with pytest.raises(ManifestError, match="cannot read Parquet file"):
            run_farm(broken, db_path=db, settings=settings)
        with pytest.raises(RunLockedError):  # a usable manifest still meets the lock: one run per DB
            run_farm(good, db_path=db, settings=settings, progress=Progress(io.StringIO(), live=False))

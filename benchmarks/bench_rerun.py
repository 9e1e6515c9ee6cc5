"""Rerun of an unchanged 1,000-row manifest, every job already answered: target <= 5 s, Ray never started.

The manifest is the bundled zoo's rows repeated over opsets and both exporters
(1,000 rows, one distinct job each). The first run is cheap but real: the farm
itself (local Ray, warm fork-server children, the DuckDB store) runs every job
with a fake stage (``_jobs.tiny_result``), so the database holds exactly what the
farm writes under exactly the keys its planner computes. The second run is timed
twice: ``zoo-convert run`` end to end (a fresh interpreter), and ``run_farm`` in
this process (Ray not imported yet, so its start-up would show). Both must find
nothing to do and leave Ray alone.

    .venv/bin/python benchmarks/bench_rerun.py [--rows 1000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import BIN, build_zoo, machine, verdict, zoo_rows

TARGET_S = 5.0
BENCH_DIR = Path(__file__).resolve().parent
# Newest opsets first: a real nightly sweeps the recent ones; older ones only fill up to --rows.
OPSETS = (*range(23, 13, -1), *range(13, 6, -1))


def write_rows(zoo_dir: Path, n: int) -> Path:
    """``n`` distinct rows: each zoo model x exporter x opset, newest opsets first."""
    from zoo_convert.manifest import write_manifest

    base = zoo_rows(zoo_dir / "manifest.parquet")
    rows = [
        {**r, "opsets": [opset], "exporter": exporter}
        for opset in OPSETS
        for exporter in ("optimum", "torch")
        for r in base
    ]
    assert len(rows) >= n, f"the zoo gives only {len(rows)} distinct rows"
    return write_manifest(rows[:n], zoo_dir / f"rerun-{n}.parquet")


def ray_sessions() -> set[str]:
    """Ray's session folders: a new one appears whenever a local Ray instance starts."""
    root = Path(tempfile.gettempdir(), "ray")
    return {p.name for p in root.glob("session_*")} if root.is_dir() else set()


def main() -> int:
    """Fill the DB through the farm, then time the unchanged rerun both ways."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1000)
    args = ap.parse_args()
    print(machine())
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="bench-rerun-") as tmp:
        zoo_dir = Path(tmp, "zoo")
        build_zoo(zoo_dir)
        manifest = write_rows(zoo_dir, args.rows)
        db, out = Path(tmp, "results.duckdb"), Path(tmp, "artifacts")
        t0 = time.perf_counter()
        first = subprocess.run(
            [sys.executable, "-c", _FILL, str(manifest), str(db), str(out)], capture_output=True, text=True
        )
        assert first.returncode == 0, first.stdout + first.stderr
        print(f"first run (farm, fake stage): {first.stdout.strip()} in {time.perf_counter() - t0:.0f} s")

        before = ray_sessions()
        t0 = time.perf_counter()
        cli = subprocess.run([str(BIN / "zoo-convert"), "run", str(manifest), "--db", str(db), "--out", str(out)],
                             capture_output=True, text=True)  # fmt: skip
        cli_s = time.perf_counter() - t0
        cli_ray = ray_sessions() != before
        assert cli.returncode == 0, cli.stdout + cli.stderr
        print(f"rerun, zoo-convert run (CLI): {cli_s:.2f} s: {cli.stdout.strip()}")

        import ray

        from zoo_convert.farm.driver import run_farm
        from zoo_convert.records import Settings

        t0 = time.perf_counter()
        report = run_farm(manifest, db_path=db, settings=Settings(out_dir=str(out.resolve())))
        lib_s = time.perf_counter() - t0
        lib_ray = report.ray_started or ray.is_initialized()
        print(f"rerun, run_farm (library):    {lib_s:.2f} s: {report.skipped} of {report.total} skipped,"
              f" {report.recorded} recorded, Ray started: {lib_ray}")  # fmt: skip
    checks = {
        f"CLI <= {TARGET_S:g} s": cli_s <= TARGET_S,
        f"library <= {TARGET_S:g} s": lib_s <= TARGET_S,
        "all skipped": report.skipped == report.total == args.rows and report.recorded == 0,
        "Ray not started": not cli_ray and not lib_ray,
    }
    return verdict(
        "bench_rerun",
        checks,
        f"unchanged {args.rows}-row rerun: CLI {cli_s:.2f} s, library {lib_s:.2f} s, Ray started: {cli_ray or lib_ray}"
        f" (target {TARGET_S:g} s)",
    )


# The first run, in its own interpreter so this one starts the timed rerun without Ray imported.
_FILL = """
import sys
from pathlib import Path
from _jobs import tiny_result
from zoo_convert.farm.driver import Progress, run_farm
from zoo_convert.records import Settings
manifest, db, out = sys.argv[1:]
r = run_farm(manifest, db_path=db, settings=Settings(out_dir=str(Path(out).resolve())), job_fn=tiny_result,
             progress=Progress(open("/dev/null", "w")))
assert r.recorded == r.by_status["passed"] == r.total, r
print(f"{r.recorded} jobs recorded")
"""


if __name__ == "__main__":
    sys.exit(main())

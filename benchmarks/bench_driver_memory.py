"""Driver memory over a 10,000-job farm run of a cheap fake stage: target flat.

The farm runs for real (local Ray, warm fork-server children, one DuckDB
transaction per result) with ``job_fn=_jobs.tiny_result`` in place of the
pipeline, over a manifest of distinct jobs (tiny local folders x opsets x
exporters). A ``Progress`` hook samples the driver's resident memory as results
land. Flat means: RSS grows by less than 10% between result 2,000 and the last
one (the first thousands include Ray's and DuckDB's one-off allocations); the
least-squares slope over the same range is printed too.

    .venv/bin/python benchmarks/bench_driver_memory.py [--jobs 10000] [--every 250]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import machine, rss_bytes, verdict

from zoo_convert.farm.driver import FarmOptions, FarmReport, Progress, run_farm
from zoo_convert.manifest import MAX_OPSET, MIN_OPSET, write_manifest
from zoo_convert.records import ConversionResult, Settings

MAX_GROWTH = 0.10
STEADY_FROM = 2000
BENCH_DIR = Path(__file__).resolve().parent


class Sampler(Progress):
    """Farm progress that records (results so far, driver RSS) every ``every`` results, quietly."""

    def __init__(self, every: int) -> None:
        super().__init__(open(os.devnull, "w"), live=False)
        self.every = every
        self.samples: list[tuple[int, float, int]] = []  # (results, seconds since start, rss bytes)

    def start(self, report: FarmReport, todo: int) -> None:
        super().start(report, todo)
        self.samples.append((0, 0.0, rss_bytes()))

    def result(self, report: FarmReport, result: ConversionResult) -> None:
        if report.recorded % self.every == 0:
            self.samples.append((report.recorded, time.monotonic() - self.t0, rss_bytes()))


def write_jobs(folder: Path, jobs: int) -> Path:
    """A manifest of exactly ``jobs`` distinct jobs over tiny checkpoint folders."""
    opsets = list(range(MIN_OPSET, MAX_OPSET + 1))
    rows: list[dict] = []
    left, n = jobs, 0
    while left > 0:
        ckpt = folder / f"m{n:05d}"
        ckpt.mkdir(parents=True)
        (ckpt / "config.json").write_text('{"model_type": "bert"}')
        for exporter in ("optimum", "torch"):
            take = opsets[: min(left, len(opsets))]
            if take:
                rows.append({"source": str(ckpt), "task": "feature-extraction", "opsets": take,
                             "exporter": exporter, "variants": ["fp32", "int8"]})  # fmt: skip
            left -= len(take)
        n += 1
    return write_manifest(rows, folder / "manifest.parquet")


def slope(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def main() -> int:
    """Run the farm with the sampler; print the samples; exit 1 if memory grows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--every", type=int, default=250, help="sample every N results")
    ap.add_argument("--num-cpus", type=int, default=os.cpu_count())
    args = ap.parse_args()
    print(machine())
    # Ray workers (and the job children, which take their sys.path) must import _jobs to unpickle the job function
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="bench-mem-") as tmp:
        manifest = write_jobs(Path(tmp, "zoo"), args.jobs)
        from _jobs import tiny_result

        sampler = Sampler(args.every)
        report = run_farm(
            manifest,
            db_path=Path(tmp, "r.duckdb"),
            settings=Settings(out_dir=str(Path(tmp, "out"))),
            options=FarmOptions(num_cpus=args.num_cpus),
            job_fn=tiny_result,
            progress=sampler,
        )
    assert report.recorded == args.jobs and report.by_status["passed"] == args.jobs, report
    print(f"{'results':>8} {'seconds':>8} {'RSS MB':>8}")
    for n, t, rss in sampler.samples:
        print(f"{n:>8} {t:>8.1f} {rss / 2**20:>8.1f}")
    steady = [(n, rss) for n, _, rss in sampler.samples if n >= min(STEADY_FROM, args.jobs // 5)]
    first, last = steady[0], sampler.samples[-1]
    growth = (last[2] - first[1]) / first[1]
    per_result = slope(steady)
    rate = report.recorded / report.seconds
    print(f"run {report.seconds:.0f} s ({rate:.0f} results/s, Ray start included); "
          f"RSS {first[1] / 2**20:.0f} MB at {first[0]} -> {last[2] / 2**20:.0f} MB at {last[0]}; "
          f"slope {per_result:.0f} bytes/result")  # fmt: skip
    checks = {f"growth < {MAX_GROWTH:.0%}": growth < MAX_GROWTH}
    return verdict(
        "bench_driver_memory",
        checks,
        f"{report.recorded} results: driver RSS {growth:+.1%} from result {first[0]} to {last[0]}"
        f" ({per_result:.0f} bytes/result), {rate:.0f} results/s",
    )


if __name__ == "__main__":
    sys.exit(main())

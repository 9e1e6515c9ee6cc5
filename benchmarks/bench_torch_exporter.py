"""The torch exporter's time per job against optimum's, side by side through the farm; target <= 2x per job.

The same zoo rows, fp32, ``--no-benchmark``, through ``zoo-convert run --num-cpus 1`` (Ray, the warm
fork server, one job at a time), once with every row's exporter ``torch`` and once ``optimum``,
alternating (torch, optimum, torch, optimum ...) with a fresh DB and no fork server up before
each run, so each pays its own warm-up as a nightly run does (the torch run's server warms the
torch exporter too: ``zoo_convert.farm.warm_torch``). From each DB: per job its ``export_s`` and
the whole job (``finished_at - started_at``); per model the fastest of ``--repeat`` runs of each
side; the torch/optimum ratio per model and the median ratio. The CPU seconds of each
``zoo-convert run`` (the whole process tree: driver, Ray, fork server, jobs) and the load
average are printed beside the wall times: the machine may be shared.

``--realsize`` runs real-size checkpoints instead (random weights, the real configurations of
``_realsize.py``, built once into build/realsize/ckpt as ``bench_realsize.py`` builds them): the
tiny zoo shows torch.export's fixed cost per graph, real sizes what a nightly run of real
checkpoints pays.

    .venv/bin/python benchmarks/bench_torch_exporter.py [--only bert,gpt2,vit] [--models N] [--repeat 2] [--zoo DIR]
    .venv/bin/python benchmarks/bench_torch_exporter.py --realsize bert-base,gpt2,t5-small,vit-base --repeat 1
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import duckdb
from _common import BIN, add_zoo_options, build_zoo, cpu_model, machine, verdict, wait_for_cold_fork_servers, zoo_job_rows, zoo_rows

from zoo_convert.farm.isolation import WARM_MODULE, WARM_TORCH_MODULE
from zoo_convert.manifest import write_manifest

TARGET = 2.0
# Single-graph, decoder-with-past and encoder-decoder rows, and a timm model: the families the torch exporter takes.
_PRELOADS = (WARM_MODULE, WARM_TORCH_MODULE)
DEFAULT_ONLY = "bert,distilbert,roberta,gpt2,llama,t5,vit,resnet,whisper,timm-resnet18"


def main() -> int:
    """Alternate the two exporters' farm runs; print per-job seconds and ratios; exit 1 over the target."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_zoo_options(ap)
    ap.add_argument("--only", default=DEFAULT_ONLY, help="comma-separated zoo model names (ignored with --models)")
    ap.add_argument("--repeat", type=int, default=2, help="farm runs of each exporter; per model the fastest counts")
    ap.add_argument("--realsize", help="comma-separated real-size checkpoints of _realsize.py instead of zoo models")
    args = ap.parse_args()
    print(machine(), "|", cpu_model(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-torch-") as tmp:
        work = args.keep or Path(tmp)
        if args.realsize:
            rows = _realsize_rows(args.realsize.split(","))
        else:
            rows = zoo_job_rows(args, work) if args.models else _named_rows(args, work)
        rows = [{**r, "variants": ["fp32"]} for r in rows]
        runs: dict[str, list[dict[str, tuple[float, float, str]]]] = {"torch": [], "optimum": []}
        for i in range(args.repeat):
            for exporter in ("torch", "optimum"):
                label = f"{exporter}-{i + 1}"
                jobs, wall, cpu, load = _farm_run(label, [{**r, "exporter": exporter} for r in rows], work)
                runs[exporter].append(jobs)
                in_jobs = sum(job for _, job, _ in jobs.values())
                print(f"{label}: run {wall:.1f} s wall, {cpu:.1f} s CPU (process tree), jobs {in_jobs:.1f} s, "
                      f"load {load:.1f}", flush=True)  # fmt: skip
    return _report(rows, runs, "real-size" if args.realsize else "zoo")


def _named_rows(args: argparse.Namespace, work: Path) -> list[dict]:
    """The zoo rows named by ``--only``, in that order (the zoo built under ``work`` unless ``--zoo``)."""
    zoo_dir = args.zoo or work / "zoo"
    names = args.only.split(",")
    if args.zoo is None:
        build_zoo(zoo_dir, names)
    by_name = {Path(r["source"]).name: r for r in zoo_rows(zoo_dir / "manifest.parquet")}
    rows = [{**by_name[n], "source": str((zoo_dir / by_name[n]["source"]).resolve())} for n in names]
    print(f"{len(rows)} models: {' '.join(names)}", flush=True)
    return rows


def _realsize_rows(names: list[str]) -> list[dict]:
    """One row per real-size checkpoint, built now unless built already, with the task both tools export."""
    from _realsize import BY_NAME
    from bench_realsize import checkpoint

    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown --realsize {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    rows = [{"source": str(checkpoint(BY_NAME[n])), "task": BY_NAME[n].task} for n in names]
    print(f"{len(rows)} real-size models: {' '.join(names)}", flush=True)
    return rows


def _farm_run(label: str, rows: list[dict], work: Path) -> tuple[dict[str, tuple[float, float, str]], float, float, float]:
    """One ``zoo-convert run`` on a fresh DB with no fork server up: {model: (export_s, job_s, status)}, wall, CPU, load."""
    folder = work / label
    manifest = write_manifest(rows, folder / "manifest.parquet")
    db = folder / "results.duckdb"
    cmd = [str(BIN / "zoo-convert"), "run", str(manifest), "--db", str(db), "--out", str(folder / "artifacts"),
           "--num-cpus", "1", "--no-benchmark"]  # fmt: skip
    wait_for_cold_fork_servers(_PRELOADS)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    server_cpu = wait_for_cold_fork_servers(_PRELOADS)  # the server and its jobs: nobody's children
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) + server_cpu
    (folder / "farm.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{label}: zoo-convert run exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    con = duckdb.connect(str(db), read_only=True)
    found = con.execute(
        "SELECT any_value(source), max(export_s), epoch(any_value(finished_at)) - epoch(any_value(started_at)),"
        " any_value(job_status) FROM results GROUP BY job_key"
    ).fetchall()
    con.close()
    return {Path(src).name: (exp or 0.0, job, status) for src, exp, job, status in found}, wall, cpu, os.getloadavg()[0]


def _report(rows: list[dict], runs: dict[str, list[dict[str, tuple[float, float, str]]]], models: str) -> int:
    """Per model the fastest of each side; the ratios; the verdict on the median job ratio (the target is the zoo's)."""
    print(f"\n{'model':<22} {'torch export':>12} {'optimum export':>14} {'ratio':>6} {'torch job':>10} "
          f"{'optimum job':>11} {'ratio':>6}  status (torch / optimum)")  # fmt: skip
    export_ratios, job_ratios = [], []
    sums = {"torch": [0.0, 0.0], "optimum": [0.0, 0.0]}
    for row in rows:
        name = Path(row["source"]).name
        best = {}
        for side, side_runs in runs.items():
            seen = [r[name] for r in side_runs if name in r]
            best[side] = (min(s[0] for s in seen), min(s[1] for s in seen), "/".join(sorted({s[2] for s in seen})))
        (te, tj, ts), (oe, oj, os_) = best["torch"], best["optimum"]
        both = ts == "passed" and os_ == "passed"
        if both:
            export_ratios.append(te / oe)
            job_ratios.append(tj / oj)
            for side, (e, j, _) in best.items():
                sums[side][0] += e
                sums[side][1] += j
        print(f"{name:<22} {te:>10.2f} s {oe:>12.2f} s {te / oe:>5.1f}x {tj:>8.2f} s {oj:>9.2f} s {tj / oj:>5.1f}x  "
              f"{ts} / {os_}{'' if both else ' (not in the medians)'}")  # fmt: skip
    if not job_ratios:
        return verdict("bench_torch_exporter", {"a model both exporters passed": False}, "nothing to compare")
    med_export, med_job = statistics.median(export_ratios), statistics.median(job_ratios)
    print(f"\nmedian over the {len(job_ratios)} both passed: export {med_export:.1f}x, job {med_job:.1f}x; "
          f"medians of the seconds: torch export {statistics.median(_col(runs, rows, 'torch', 0)):.2f} s, "
          f"optimum export {statistics.median(_col(runs, rows, 'optimum', 0)):.2f} s, "
          f"torch job {statistics.median(_col(runs, rows, 'torch', 1)):.2f} s, "
          f"optimum job {statistics.median(_col(runs, rows, 'optimum', 1)):.2f} s")  # fmt: skip
    print(f"totals over them: torch jobs {sums['torch'][1]:.1f} s / optimum jobs {sums['optimum'][1]:.1f} s = "
          f"{sums['torch'][1] / sums['optimum'][1]:.1f}x")  # fmt: skip
    return verdict(
        "bench_torch_exporter",
        {f"median job ratio <= {TARGET:g}x": med_job <= TARGET},
        f"{models} models: torch/optimum per job {med_job:.1f}x (export {med_export:.1f}x), {machine()}",
    )


def _col(runs: dict[str, list[dict[str, tuple[float, float, str]]]], rows: list[dict], side: str, i: int) -> list[float]:
    """The fastest seconds (export: i=0, job: i=1) of each model on one side."""
    names = [Path(r["source"]).name for r in rows]
    return [min(r[n][i] for r in runs[side] if n in r) for n in names if any(n in r for r in runs[side])]


if __name__ == "__main__":
    raise SystemExit(main())

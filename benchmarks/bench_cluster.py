"""The farm on a Ray cluster of several nodes on this machine: how many conversions each node runs at once.

A local ``ray.cluster_utils.Cluster`` (a head with no CPU, ``--nodes`` worker nodes of
``--cpus`` CPUs each) runs the bundled zoo's first ``--models`` rows through ``run_farm``, as a
nightly run on a cluster does (benchmark phase, deployment targets, every variant). Printed: the
run's wall time, each node's most conversions at once (the run's leases actor counts them), the
summed stage seconds of the jobs (a job that converts beside more jobs than its node has CPUs
takes longer in each stage), the target checks' seconds, and the latencies flagged noisy.

Target: no node converts more jobs at once than it has CPUs. Before a converting task kept its
CPU in Ray's count (2026-12-05, two 1-CPU nodes, 24 models, AMD EPYC with AVX-512 VNNI, quiet),
each ``ray.get``/``ray.wait`` it made gave the CPU back to Ray, which started more tasks there:
3 conversions at once on a 1-CPU node, the run 66-69 s against 54 s, its jobs' stage seconds ~3x.

    .venv/bin/python benchmarks/bench_cluster.py [--models 24] [--nodes 2] [--cpus 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import ray
from ray.cluster_utils import Cluster

from _common import build_zoo, cpu_model, machine, verdict
from zoo_convert.farm.driver import FarmOptions, Progress, run_farm
from zoo_convert.records import Settings

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=24, help="the zoo's first N rows")
    ap.add_argument("--nodes", type=int, default=2, help="worker nodes")
    ap.add_argument("--cpus", type=int, default=1, help="CPUs of each worker node")
    ap.add_argument("--keep", type=Path, help="work here and keep the DB and artifacts")
    args = ap.parse_args(argv)
    print(machine(), "|", cpu_model(), flush=True)
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_cluster-"))
    work.mkdir(parents=True, exist_ok=True)
    zoo = ROOT / "build" / "demo" / "zoo"
    if not (zoo / "manifest.parquet").exists():
        build_zoo(zoo)
    manifest = zoo / f"bench_cluster_{args.models}.parquet"  # beside the zoo: its sources are relative to it
    pq.write_table(pq.read_table(zoo / "manifest.parquet").slice(0, args.models), manifest)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=args.cpus)
        cluster.wait_for_nodes()
        t0 = time.monotonic()
        report = run_farm(manifest, db_path=work / "results.duckdb", settings=Settings(out_dir=str(work / "artifacts")),
                          options=FarmOptions(address=cluster.address), progress=Progress(live=False))  # fmt: skip
        wall = time.monotonic() - t0
    finally:
        ray.shutdown()
        cluster.shutdown()
        manifest.unlink(missing_ok=True)
    with duckdb.connect(str(work / "results.duckdb"), read_only=True) as con:
        stages = con.execute("SELECT sum(export_s), sum(optimize_s), sum(verify_s), count(*) FILTER (WHERE bench_noisy),"
                             " count(ort_p50_ms) FROM results").fetchone()  # fmt: skip
        targets = con.execute("SELECT target, round(sum(seconds), 1) FROM target_results GROUP BY 1 ORDER BY 1").fetchall()
    most = {node[:8]: int(s["most_converting"]) for node, s in report.latency.items()}
    print(f"{report.recorded} of {args.models} recorded in {wall:.1f} s on {args.nodes} nodes of {args.cpus} CPU(s)")
    print(f"most conversions at once per node: {most}")
    export_s, optimize_s, verify_s, noisy, timed = stages
    print(f"stage seconds summed over the jobs: export {export_s:.1f}, optimize {optimize_s:.1f}, verify {verify_s:.1f}")
    print(f"target seconds: {', '.join(f'{t} {s}' for t, s in targets)}; noisy latencies {noisy} of {timed}")
    over = [node for node, n in most.items() if n > args.cpus]
    checks = {"recorded every job": report.recorded == args.models, "conversions <= CPUs per node": not over and bool(most)}
    return verdict("bench_cluster", checks, f"wall {wall:.1f} s, most at once {max(most.values(), default=0)} per node"
                   f" of {args.cpus} CPU(s), noisy {noisy} of {timed}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

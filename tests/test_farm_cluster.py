"""Several Ray nodes on one machine; a worker node dies mid-run and every job still ends with one result."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
import ray
from ray.cluster_utils import Cluster

from zoo_convert.errors import FailureKind
from zoo_convert.farm.driver import FarmOptions, FarmReport, Progress, run_farm
from zoo_convert.farm.isolation import failure_result
from zoo_convert.manifest import write_manifest
from zoo_convert.pipeline import StageCallback, convert_one
from zoo_convert.records import ConversionResult, ManifestEntry, Settings
from zoo_convert.stages.forked import alone_on_node

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # a Ray cluster of several nodes, registered as the machine's

TESTS = Path(__file__).resolve().parent


def held_convert(
    entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None
) -> ConversionResult:
    """The real pipeline, held until the test has removed a node (the file ``go``), with a marker file while it runs."""
    marker = Path(settings.out_dir, "running", str(os.getpid()))
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    go, deadline = Path(settings.out_dir, "go"), time.monotonic() + 300
    try:
        while not go.exists():  # the jobs run in other processes: a file is the event they can wait on
            if time.monotonic() > deadline:
                raise TimeoutError("the test never removed a node")
            time.sleep(0.05)
        return convert_one(entry, settings, on_stage=on_stage)
    finally:
        marker.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # the nodes' workers import this module to unpickle held_convert
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), old) if p)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        c.add_node(num_cpus=1, num_gpus=1)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = old


class KillNodeWhileBusy(Progress):
    """Removes a worker node (SIGKILL, no drain) once two jobs run at the same time; lets the jobs go on
    once the driver has seen the lost one.

    Each node has one CPU, so two running jobs (two markers of held_convert) are one per
    node, and neither can finish before ``go``: the kill lands mid-job. ``go`` waits for the
    driver's retry because the held job runs in the machine's fork server, which outlives
    the node: let go at once, it could finish and hand its result over before the killed
    worker is noticed, and no job would have been lost.
    """

    def __init__(self, cluster: Cluster, out_dir: Path) -> None:
        super().__init__(live=False)
        self.cluster, self.markers, self.go = cluster, out_dir / "running", out_dir / "go"
        self.killed = False

    def tick(self, report: FarmReport, running: int) -> None:
        super().tick(report, running)
        if not self.killed and len(list(self.markers.glob("*"))) >= 2:
            # Not the node the driver joined (all share one address: it may be a worker's), where the run's actors
            # live: losing it is losing the driver's machine, not a worker.
            driver = ray.get_runtime_context().get_node_id()
            lost = [n for n in self.cluster.worker_nodes if n.node_id != driver][-1]
            self.cluster.remove_node(lost, allow_graceful=False)
            self.killed = True
        if self.killed and report.retries >= 1 and not self.go.exists():
            self.go.touch()


def test_node_lost_mid_run(cluster: Cluster, zoo_dir: Path, tmp_path: Path) -> None:
    names = ("bert", "vit", "resnet", "roberta")
    rows = [{"source": str(zoo_dir / n), "variants": ["fp32"]} for n in names]
    rows.append({"source": str(zoo_dir / "bert"), "task": "feature-extraction", "variants": ["fp32"], "gpu": True})
    manifest = write_manifest(rows, tmp_path / "m.parquet")
    db = tmp_path / "r.duckdb"
    progress = KillNodeWhileBusy(cluster, tmp_path / "out")
    report = run_farm(
        manifest,
        db_path=db,
        settings=Settings(out_dir=str(tmp_path / "out"), bench_warmup=0, bench_runs=2),
        options=FarmOptions(address=cluster.address, backoff_s=0.1),
        job_fn=held_convert,
        progress=progress,
    )
    assert progress.killed and report.recorded == len(rows)
    assert report.retries >= 1  # the removed node was running a job
    with duckdb.connect(str(db), read_only=True) as con:
        jobs = con.execute(
            "SELECT manifest_row, count(DISTINCT job_key), any_value(job_status), any_value(failure_kind),"
            " any_value(attempts) FROM results GROUP BY 1 ORDER BY 1"
        ).fetchall()
        resources = con.execute("SELECT resources FROM runs").fetchone()[0]
    assert [j[0] for j in jobs] == [1, 2, 3, 4, 5] and all(j[1] == 1 for j in jobs)
    # lost workers are retried elsewhere, not recorded as failures
    assert all(j[3] != "worker_lost" for j in jobs), jobs
    assert all(j[2] == "passed" for j in jobs[:4]), jobs
    assert '"GPU": 2.0' in resources


class KillBusiestNode(Progress):
    """Once every CPU of the cluster runs a held job, removes the node added with three CPUs (three jobs at once);
    lets the jobs go on once the driver has put all three back in the queue."""

    def __init__(self, cluster: Cluster, node: Any, out_dir: Path) -> None:
        super().__init__(live=False)
        self.cluster, self.node, self.markers, self.go = cluster, node, out_dir / "running", out_dir / "go"
        self.killed = False

    def tick(self, report: FarmReport, running: int) -> None:
        super().tick(report, running)
        if not self.killed and len(list(self.markers.glob("*"))) >= int(ray.cluster_resources().get("CPU", 0)):
            self.cluster.remove_node(self.node, allow_graceful=False)
            self.killed = True
        if self.killed and report.retries >= 3 and not self.go.exists():
            self.go.touch()


def test_one_node_lost_with_three_jobs_on_it_is_one_fault_not_three_in_a_row(
    cluster: Cluster, zoo_dir: Path, tmp_path: Path
) -> None:
    """Counted one job at a time, the three lost tasks of one node were "3 jobs in a row met worker_lost" at the
    default 3 attempts, and the run stopped with every job of it unanswered."""
    big = cluster.add_node(num_cpus=3)
    cluster.wait_for_nodes()
    names = ("bert", "vit", "resnet", "roberta", "gpt2")
    rows = [{"source": str(zoo_dir / n), "variants": ["fp32"], "targets": []} for n in names]
    manifest = write_manifest(rows, tmp_path / "m.parquet")
    db = tmp_path / "r.duckdb"
    progress = KillBusiestNode(cluster, big, tmp_path / "out")
    report = run_farm(
        manifest,
        db_path=db,
        settings=Settings(out_dir=str(tmp_path / "out"), benchmark=False),
        options=FarmOptions(address=cluster.address, backoff_s=0.1),
        job_fn=held_convert,
        progress=progress,
    )
    assert progress.killed and report.retries >= 3, report
    assert report.stopped is None, report.stopped
    assert report.recorded == len(rows) and report.by_status["passed"] == len(rows), dict(report.by_status)
    with duckdb.connect(str(db), read_only=True) as con:
        lost = con.execute("SELECT count(*) FROM results WHERE failure_kind = 'worker_lost'").fetchone()[0]
    assert lost == 0


def converts_then_is_timed(
    entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None
) -> ConversionResult:
    """A job's shape without a model: 1.5 s "converting" (the task watching it polls its node's phase), then timed in
    its node's latency phase."""
    time.sleep(1.5)
    with alone_on_node():
        time.sleep(0.1)
    return failure_result(entry, FailureKind.EXPORT_ERROR, "this test's job converts nothing")


def test_a_node_of_a_cluster_converts_no_more_jobs_at_once_than_its_cpus(cluster: Cluster, tmp_path: Path) -> None:
    """Every call a converting task made to the run's actor went through ray.get or ray.wait, and each gave the task's
    CPU back to Ray for the call, 20 times a second while the task watched its job: Ray started more tasks on the
    node, which converted beside it (on one node the actor's slots kept them waiting; a cluster had no such count).
    A task now keeps its CPU until its conversion is over."""
    cluster.add_node(num_cpus=1)  # at least two nodes with CPUs: a cluster, whatever the tests before left
    cluster.wait_for_nodes()
    for i in range(6):
        (tmp_path / f"m{i}").mkdir()
        (tmp_path / f"m{i}" / "config.json").write_text('{"model_type": "bert"}')
    manifest = write_manifest([{"source": str(tmp_path / f"m{i}"), "task": "fill-mask"} for i in range(6)],
                              tmp_path / "m.parquet")  # fmt: skip
    report = run_farm(
        manifest,
        db_path=tmp_path / "r.duckdb",
        settings=Settings(out_dir=str(tmp_path / "out")),
        options=FarmOptions(address=cluster.address),
        job_fn=converts_then_is_timed,
        progress=Progress(live=False),
    )
    assert report.recorded == 6 and report.stopped is None, report
    cpus = {n.node_id: n._ray_params.num_cpus for n in cluster.list_all_nodes()}
    assert report.latency and set(report.latency) <= set(cpus), (report.latency, cpus)
    most = {node: int(seconds["most_converting"]) for node, seconds in report.latency.items()}
    over = [f"{most[node]} conversions at once on a node of {cpus[node]} CPU(s)" for node in most if most[node] > cpus[node]]
    assert not over, over
    assert sum(int(s["phases"]) for s in report.latency.values()) >= 1  # the jobs were timed in phases

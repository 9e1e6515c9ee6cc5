"""The farm's latency phase: no benchmark shares its node with a conversion, nor its CPUs with another benchmark
(real Ray, real exports, real ORT and torch)."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import duckdb
import pytest

from zoo_convert import zoo
from zoo_convert.farm import driver
from zoo_convert.farm.driver import FarmOptions, run_farm
from zoo_convert.pipeline import StageCallback, convert_one
from zoo_convert.records import ConversionResult, ManifestEntry, Settings

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # starts Ray and converts six models; pins and times them

NAMES = ("bert", "vit", "resnet", "roberta", "gpt2", "t5")


def kept(entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None) -> ConversionResult:
    """The real pipeline, its whole record (stage details included) kept beside the artifacts for the test to read."""
    result = convert_one(entry, settings, on_stage=on_stage)
    Path(settings.out_dir, f"{Path(entry.source).name}.result.json").write_text(result.to_json())
    return result


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_each_benchmark_has_its_cpus_to_itself_and_the_run_says_where_its_seconds_went(
    local_ray: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two CPUs, one benchmark thread: two lanes, each job pinned to one CPU; one timed beside another is on the other.
    A phase begins once two jobs wait (one per CPU): the conversions running then are paused, stopped until it ends."""
    monkeypatch.setattr(driver, "BENCH_BACKLOG_PER_CPU", 1)
    manifest = zoo.build(tmp_path / "zoo", NAMES)
    out, db = tmp_path / "out", tmp_path / "results.duckdb"
    settings = Settings(out_dir=str(out))
    report = run_farm(manifest, db_path=db, settings=settings, options=FarmOptions(), job_fn=kept)
    assert report.by_status["passed"] == len(NAMES), report.failures

    results = [ConversionResult.from_json((out / f"{name}.result.json").read_text()) for name in NAMES]
    # Each job: converting from its start until it asked for its node (its benchmark's start less the wait for it);
    # timed in its benchmark's window.
    converting, timing, cpus, paused = {}, {}, {}, {}
    for r in results:
        paused[r.source] = r.paused
        bench = next(s for s in r.stages if s.stage == "benchmark")
        start, end = bench.details["window"]
        assert r.started_at is not None and "lease_wait_s" in bench.details
        asked = start - bench.details["lease_wait_s"]
        converting[r.source], timing[r.source] = (_epoch(r.started_at), asked), (start, end)
        cpus[r.source] = set(bench.details["cpus"])
        assert len(cpus[r.source]) == settings.threads == 1, bench.details  # a lane of two CPUs at one thread
    beside = 0
    for a, (t0, t1) in timing.items():
        for b in timing:
            if b == a:
                continue
            c0, c1 = converting[b]
            if not (t1 <= c0 or t0 >= c1):  # only while b was stopped
                overlap = (max(t0, c0), min(t1, c1))
                assert any(p0 <= overlap[0] and overlap[1] <= p1 for p0, p1 in paused[b]), (
                    f"{Path(a).name} was timed while {Path(b).name} converted (paused: {paused[b]})")
            s0, s1 = timing[b]
            if not (t1 <= s0 or t0 >= s1):
                beside += 1
                assert not cpus[a] & cpus[b], f"{Path(a).name} and {Path(b).name} were timed at once on CPUs {cpus[a]}"
    assert beside, "no two jobs were timed at once: the second lane went unused"

    # The figures go into the same latency columns as ever, once per job and variant, at a recorded thread count.
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT source, variant, ort_p50_ms, torch_p50_ms, ort_runs, torch_runs, bench_threads, bench_load"
            " FROM results WHERE status = 'passed'"
        ).fetchall()
    assert len(rows) == len({(r[0], r[1]) for r in rows}) == 3 * len(NAMES)
    for source, variant, ort, torch, ort_runs, torch_runs, threads, others in rows:
        assert ort and torch and ort_runs >= settings.bench_runs and torch_runs >= settings.bench_runs, (source, variant)
        assert threads == settings.threads and others is not None

    # The run says how long its latency phases took, and it is printed.
    (node,) = report.latency.values()
    assert node["phases"] >= 1 and 0 < node["timed_s"] <= node["phase_s"] < report.seconds and node["lanes"] == 2
    # A conversion was paused. Its window is in its job's record only where the pause reached into the job's own
    # run: a job stopped as its process started (its slot taken, a phase beginning at once) starts its record after
    # the pause (seen in CI: one pause, no window); tests/test_isolation.py checks the windows of a job paused mid-run.
    assert node["pauses"] >= 1, node
    for r in results:  # a stage's seconds leave its pauses out: a stage never outlasts its job's wall time less them
        wall = _epoch(r.finished_at) - _epoch(r.started_at) - sum(p1 - p0 for p0, p1 in paused[r.source])
        assert sum(s.seconds for s in r.stages) <= wall + 0.5, (r.source, wall)
    print(report.latency, file=sys.stderr)


def test_a_node_times_as_many_jobs_at_once_as_it_has_lanes_and_a_gpu_job_alone() -> None:
    """The phase's bookkeeping (the actor's class, run here without Ray): lanes granted apart, a whole-node job waits."""
    import asyncio

    from zoo_convert.farm.driver import _NodeLeases

    async def scenario(max_lanes: int | None) -> list[tuple[str, tuple[int, ...]]]:
        leases, granted = _NodeLeases(backlog=4, max_lanes=max_lanes), []

        async def job(token: str, whole: bool = False) -> None:
            held, lanes = await leases.bench("n", token, 2, whole)
            granted.append((token, held if len(held) < lanes else "whole node"))

        for token in ("a", "b", "gpu", "c"):  # all four convert; the phase begins once the last asks to be timed
            await leases.convert("n", token, 4)
        tasks = [asyncio.create_task(job(t, whole=t == "gpu")) for t in ("a", "b", "gpu", "c")]
        await asyncio.sleep(0.05)
        first = list(granted)
        for token in ("a", "b", "gpu", "c"):
            await leases.forget(token)
            await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)
        return first + [("then", ())] + granted[len(first):]

    # Two lanes: a and b at once, each on a lane of its own; the GPU job waits for both, then c.
    assert asyncio.run(scenario(None)) == [("a", (0,)), ("b", (1,)), ("then", ()), ("gpu", "whole node"), ("c", (0,))]
    # --bench-lanes 1: one at a time, each holding the whole node.
    whole = "whole node"
    assert asyncio.run(scenario(1)) == [("a", whole), ("then", ()), ("b", whole), ("gpu", whole), ("c", whole)]


def test_a_phase_pauses_the_conversions_running_and_they_go_on_after_it() -> None:
    """The phase's bookkeeping (the actor's class, without Ray): a phase begun while b converts is granted once b is
    paused, not when b ends; b and new conversions go on when the phase is over."""
    import asyncio

    from zoo_convert.farm.driver import _NodeLeases

    async def scenario() -> None:
        leases = _NodeLeases(backlog=1)
        await leases.convert("n", "a", 3)
        await leases.convert("n", "b", 3)
        phase_b = asyncio.create_task(leases.until_phase("n", "b"))
        bench_a = asyncio.create_task(leases.bench("n", "a", 2, False))
        await asyncio.sleep(0.05)
        assert phase_b.done() and not bench_a.done()  # a waits: the phase began, b still converts
        paused_b = asyncio.create_task(leases.pause("n", "b"))
        await asyncio.sleep(0.05)
        assert bench_a.done() and not paused_b.done()  # a is timed while b is stopped; b waits for the phase's end
        convert_c = asyncio.create_task(leases.convert("n", "c", 3))
        await asyncio.sleep(0.05)
        assert not convert_c.done()  # no new conversion in a phase
        await leases.forget("a")
        await asyncio.sleep(0.05)
        assert paused_b.done() and convert_c.done()
        assert leases.nodes["n"].converting == {"b", "c"}
        seconds = (await leases.seconds())["n"]
        assert seconds["pauses"] == 1 and seconds["phases"] == 1 and seconds["drain_s"] < 0.5

    asyncio.run(scenario())


def test_a_node_converts_no_more_jobs_at_once_than_its_slots() -> None:
    """The actor's class, without Ray: a job waiting in ``ray.get`` gives its CPU back to Ray, which starts another
    task; the actor, not Ray's CPU count, keeps a node to ``slots`` conversions (its CPUs over a job's threads).
    A paused conversion keeps its slot: it goes on after the phase."""
    import asyncio

    from zoo_convert.farm.driver import _NodeLeases

    async def scenario() -> None:
        leases = _NodeLeases(backlog=1)
        await leases.convert("n", "a", 2)
        await leases.convert("n", "b", 2)
        convert_c = asyncio.create_task(leases.convert("n", "c", 2))
        await asyncio.sleep(0.05)
        assert not convert_c.done()  # two slots, both taken
        phase_b = asyncio.create_task(leases.until_phase("n", "b"))
        bench_a = asyncio.create_task(leases.bench("n", "a", 2, False))  # a converted: a phase begins for it
        await asyncio.sleep(0.05)
        assert phase_b.done() and not convert_c.done()  # a's slot is free, but no conversion starts in a phase
        paused_b = asyncio.create_task(leases.pause("n", "b"))
        await asyncio.sleep(0.05)
        assert bench_a.done() and not convert_c.done()  # b, paused, keeps its slot
        await leases.forget("a")  # timed: the phase is over
        await asyncio.sleep(0.05)
        assert paused_b.done() and convert_c.done() and leases.nodes["n"].converting == {"b", "c"}
        convert_d = asyncio.create_task(leases.convert("n", "d", 2))
        await asyncio.sleep(0.05)
        assert not convert_d.done()
        await leases.forget("c")
        await asyncio.sleep(0.05)
        assert convert_d.done() and leases.nodes["n"].converting == {"b", "d"}
        await leases.convert("n", "e", None)  # a cluster's node: Ray's count, none here
        assert leases.nodes["n"].converting == {"b", "d", "e"}

    asyncio.run(scenario())

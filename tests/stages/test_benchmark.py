"""Benchmark stage: interleaved rounds, their time budget, and when a measurement is noisy."""

from __future__ import annotations

import os
import time

from zoo_convert.records import Settings
from zoo_convert.stages import Timing
from zoo_convert.stages.benchmark import MIN_RUNS, NOISY_SPREAD, _Conditions, _interleaved, _timing


def test_sides_are_timed_in_rounds_one_call_each_in_the_same_order() -> None:
    calls: list[str] = []
    sides = {name: (lambda name=name: calls.append(name)) for name in ("torch", "fp32", "int8")}
    times, failed = _interleaved(sides, Settings(bench_warmup=1, bench_runs=4, bench_budget_s=10.0))
    assert not failed and {len(ms) for ms in times.values()} == {4}
    assert calls == ["torch", "fp32", "int8"] * 5  # one warm-up round, then four timed ones


def test_runs_stop_at_the_budget_but_not_below_the_minimum() -> None:
    calls = []

    def slow() -> None:
        calls.append(1)
        time.sleep(0.01)

    times, _ = _interleaved({"torch": slow, "fp32": lambda: None}, Settings(bench_warmup=2, bench_runs=100, bench_budget_s=0.0))
    assert len(times["torch"]) == len(times["fp32"]) == MIN_RUNS and len(calls) == MIN_RUNS + 2
    assert all(t >= 10 for t in times["torch"])


def test_fast_models_get_every_run() -> None:
    times, _ = _interleaved({"fp32": lambda: None}, Settings(bench_warmup=0, bench_runs=30, bench_budget_s=1.0))
    assert len(times["fp32"]) == 30


def test_a_side_that_fails_drops_out_with_its_reason_and_the_others_go_on() -> None:
    def broken() -> None:
        raise ValueError("no kernel for this shape")

    times, failed = _interleaved({"torch": lambda: None, "fp16": broken}, Settings(bench_warmup=0, bench_runs=6))
    assert failed["fp16"][0] == "not timed: ValueError: no kernel for this shape"
    assert "fp16" not in times and len(times["torch"]) == 6


def test_timing_records_runs_percentiles_and_the_spread() -> None:
    t = _timing([10.0, 10.0, 11.0, 12.0, 30.0])
    assert (t.runs, t.p50_ms) == (5, 11.0) and t.p50_ms <= t.p90_ms
    assert t.spread == round((12.0 - 10.0) / 11.0, 4)


def test_a_spread_or_a_load_too_high_is_noisy() -> None:
    quiet = Timing(p50_ms=10.0, p90_ms=10.5, runs=20, spread=0.02)
    spread = Timing(p50_ms=10.0, p90_ms=20.0, runs=20, spread=NOISY_SPREAD + 0.01)
    cores = os.cpu_count() or 1
    calm = _Conditions(threads=1, cpu="cpu", shape="1x128", load=cores * 0.5)
    assert not calm.latency(quiet, quiet, None).noisy
    assert calm.latency(spread, quiet, None).noisy and calm.latency(quiet, spread, None).noisy
    busy = _Conditions(threads=1, cpu="cpu", shape="1x128", load=cores + 0.5)
    lat = busy.latency(quiet, quiet, None)
    assert lat.noisy and lat.load == round(cores + 0.5, 2) and lat.speedup == 1.0
    # No ORT figure, nothing to distrust: the note says why it is empty.
    empty = busy.latency(None, quiet, ("not timed: no graph", None))
    assert not empty.noisy and empty.note == "not timed: no graph" and empty.speedup is None

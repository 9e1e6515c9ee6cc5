"""Benchmark stage: repetitions and their time budget."""

from __future__ import annotations

import time

from zoo_convert.records import Settings
from zoo_convert.stages.benchmark import MIN_RUNS, _timings


def test_runs_stop_at_the_budget_but_not_below_the_minimum() -> None:
    calls = []

    def slow() -> None:
        calls.append(1)
        time.sleep(0.01)

    times = _timings(slow, Settings(bench_warmup=2, bench_runs=100, bench_budget_s=0.0))
    assert len(times) == MIN_RUNS and len(calls) == MIN_RUNS + 2
    assert all(t >= 10 for t in times)


def test_fast_models_get_every_run() -> None:
    assert len(_timings(lambda: None, Settings(bench_warmup=0, bench_runs=30, bench_budget_s=1.0))) == 30

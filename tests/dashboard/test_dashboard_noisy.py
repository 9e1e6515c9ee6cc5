"""A noisy latency (too spread, or taken under load) stays out of the speedup headline and histogram."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from synthetic import variant

from zoo_convert.dashboard.data import QUERIES, _records
from zoo_convert.records import ConversionResult
from zoo_convert.store import ResultStore


def test_noisy_speedups_are_left_out_of_the_headline_and_the_histogram(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    for name, speedup, noisy in (("a", 2.0, False), ("b", 3.0, False), ("c", 60.6, True)):
        fp32 = replace(variant("fp32"), speedup=speedup, bench_noisy=noisy)
        store.record("r", name, ConversionResult(source=f"zoo/{name}", status="passed", model_type="bert",
                                                 variants=(fp32,)))  # fmt: skip
    store.finish_run("r")
    with store.connect() as con:
        headline = _records(con, QUERIES["headline"])[0]
        hist = _records(con, QUERIES["speedup_hist"])
    assert headline["median_speedup"] == 2.5  # 60.6x under load would have made it 3.0
    assert sum(h["n"] for h in hist) == 2

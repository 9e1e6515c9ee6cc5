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
    assert (headline["speedup_n"], headline["speedup_noisy"], headline["models"]) == (2, 1, 3)  # what the page says
    assert sum(h["n"] for h in hist) == 2


def test_the_model_table_leaves_a_noisy_speedup_blank_and_the_drill_down_says_why(tmp_path: Path) -> None:
    from zoo_convert.dashboard.data import collect

    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    conditions = dict(bench_threads=1, bench_shape="1x128", bench_cpu="AMD EPYC", ort_spread=0.4)
    for name, speedup, noisy, load in (("calm", 2.0, False, 0.5), ("loaded", 60.6, True, 7.5)):
        fp32 = replace(variant("fp32"), speedup=speedup, bench_noisy=noisy, bench_load=load, **conditions)
        store.record("r", name, ConversionResult(source=f"zoo/{name}", status="passed", model_type="bert",
                                                 variants=(fp32,)))  # fmt: skip
    store.finish_run("r")
    with store.connect() as con:
        data = collect(con)
    speedups = {m["source"]: m["speedup"] for m in data["models"]}
    assert speedups == {"zoo/calm": 2.0, "zoo/loaded": None}
    by_id = {m["id"]: m["source"] for m in data["models"]}
    detail = {by_id[v["id"]]: v for v in data["detail_variants"]}
    assert detail["zoo/loaded"]["bench_noisy"] is True and detail["zoo/loaded"]["speedup"] == 60.6
    assert (detail["zoo/loaded"]["bench_load"], detail["zoo/loaded"]["bench_cpu"]) == (7.5, "AMD EPYC")
    assert detail["zoo/calm"]["bench_noisy"] is False

"""The terminal summary of one conversion: latencies with their conditions, and why one is missing."""

from __future__ import annotations

from zoo_convert.records import ConversionResult, VariantResult
from zoo_convert.report import summary


def test_the_summary_shows_each_latencys_conditions_and_why_one_is_missing() -> None:
    timed = VariantResult("fp32", "passed", ort_p50_ms=1.5, ort_runs=20, bench_shape="1x128", bench_threads=1,
                          bench_load=3.2, bench_noisy=True)  # fmt: skip  # PyTorch could not be timed
    empty = VariantResult("int8", "passed", bench_note="not timed: RuntimeError: no kernel")
    text = summary(ConversionResult(source="zoo/bert", status="passed", variants=(timed, empty)))
    assert "ort p50=1.50ms torch p50=- speedup=-  (1x128, 1 thr, load 3.2, NOISY)" in text
    assert "latency empty: not timed: RuntimeError: no kernel" in text

"""The terminal summary of one conversion: latencies with their conditions, and why one is missing."""

from __future__ import annotations

from zoo_convert.records import ConversionResult, VariantResult
from zoo_convert.dashboard.report import summary


def test_the_summary_shows_each_latencys_conditions_and_why_one_is_missing() -> None:
    timed = VariantResult("fp32", "passed", ort_p50_ms=1.5, ort_runs=20, bench_shape="1x128", bench_threads=1,
                          bench_load=3.2, bench_noisy=True)  # fmt: skip  # PyTorch could not be timed
    empty = VariantResult("int8", "passed", bench_note="not timed: RuntimeError: no kernel")
    text = summary(ConversionResult(source="zoo/bert", status="passed", variants=(timed, empty)))
    assert "ort p50=1.50ms torch p50=- speedup=-  (1x128, 1 thr, others on 3.2 CPUs, NOISY)" in text
    assert "latency empty: not timed: RuntimeError: no kernel" in text


def test_the_summary_says_which_exporter_auto_took_and_why() -> None:
    why = "optimum cannot export model_type 'starcoder2' (library transformers) for task 'feature-extraction'"
    text = summary(ConversionResult(source="zoo/starcoder2", status="passed", exporter="auto", exporter_used="torch",
                                    exporter_reason=why))  # fmt: skip
    assert "exporter=auto->torch" in text and f"generic torch export: {why}" in text
    plain = summary(ConversionResult(source="zoo/bert", status="passed", exporter="optimum", exporter_used="optimum"))
    assert "  exporter=optimum\n" in plain and "->" not in plain and "generic" not in plain

"""Job functions the benchmarks hand to the farm; a module of its own so Ray workers and the fork server can import it."""

from __future__ import annotations

from collections.abc import Callable

from zoo_convert.records import PASSED, ConversionResult, ManifestEntry, Settings, StageResult, VariantResult


def tiny_result(
    entry: ManifestEntry, settings: Settings, *, on_stage: Callable[[str], None] | None = None
) -> ConversionResult:
    """A cheap fake stage: a small passed result per variant, shaped like a real one, no work done."""
    return ConversionResult(
        source=entry.source,
        status=PASSED,
        task=entry.task,
        revision=entry.revision,
        exporter=entry.exporter,
        opset_requested=entry.opset,
        opset=entry.opset or 17,
        stages=(StageResult(stage="export", status=PASSED, seconds=0.0),),
        variants=tuple(VariantResult(variant=v, status=PASSED, file=f"onnx/{v}.onnx") for v in entry.variants),
        row=entry.row,
        tags=entry.tags,
    )

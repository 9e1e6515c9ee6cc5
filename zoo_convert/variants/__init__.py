"""The variants the farm makes of an exported graph, and how: one :class:`VariantSpec` each in :data:`REGISTRY`.

* fp32: the optimize stage's own (fusion, ORT offline optimization, or the plain export: :mod:`zoo_convert.stages.optimize`);
* fp16: :mod:`.fp16`, from the chosen fp32 graph, float32 inputs and outputs kept;
* int8 / uint8: :mod:`.int8` over :mod:`.quantize` (dynamic, per channel, streamed one weight at a time);
* q4: :mod:`.q4` (4-bit weight-only ``MatMulNBits``).

Adding a variant made from the plain export is one module here with a ``make(plain, out, external, **options)``
function and one line in :data:`REGISTRY`: the records (names, defaults, tolerances, transformers.js dtypes),
the optimize stage, the model card and the CLI read it from there. This module imports nothing heavy
(the records and the farm driver import it); a maker's module is imported when a job makes that variant.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checks import Tolerance

# 4-bit weights cost more accuracy than 8-bit ones.
Q4_MIN_COSINE = 0.95
# The relative part of the elementwise bound |onnx - torch| <= max_abs + rtol * |torch| (docs/verification.md:
# how it was chosen). fp32: the seed recipe's and ONNX's backend tests' 1e-3, ~500x the fp32 rounding a
# conv net with logits in the thousands shows (2e-6), 7e5x below what the zoo's long-shape divergences need.
# fp16: twice what fp16 rounding needs on such logits (9e-3, at elements that cancel); int8 and q4 have no bound.
FP32_RTOL = 1e-3
FP16_RTOL = 2e-2
Maker = Callable[..., tuple[Path, dict[str, Any]]]


@dataclass(frozen=True)
class VariantSpec:
    """One variant.

    Attributes:
        name: as the manifest, ``--variants``, the DB and the dashboard spell it.
        note: what it is, for the model card's dtype table.
        tolerance: its default bound against PyTorch (``Settings.tolerances``).
        js_dtypes: the transformers.js ``dtype`` names its graph answers to; the first names the recorded file.
        default: made when a job does not say which variants (the others are opt-in).
        maker: the module under variants/ whose ``make`` builds it from the plain export; None for the
            optimize stage's own (fp32, and fp16, which is made from the fp32 graph).
        options: keyword arguments of ``make``.
        quantization: the variant-level summary the record carries, for a quantized variant.
    """

    name: str
    note: str
    tolerance: Tolerance
    js_dtypes: tuple[str, ...]
    default: bool = True
    maker: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    quantization: str | None = None


INF = float("inf")
REGISTRY: dict[str, VariantSpec] = {
    spec.name: spec
    for spec in (
        VariantSpec("fp32", "float32, graph-optimized", Tolerance(max_abs=1e-4, min_cosine=0.9999, rtol=FP32_RTOL),
                    ("fp32",)),  # fmt: skip
        VariantSpec("fp16", "float16 weights and compute, float32 inputs and outputs",
                    Tolerance(max_abs=5e-2, min_cosine=0.999, rtol=FP16_RTOL), ("fp16",)),  # fmt: skip
        # transformers.js's quantize script writes the same graph for q8 and int8 (QInt8 weights, uint8
        # dynamic activations) unless the model has a Conv; then q8 gets QUInt8 weights for
        # onnxruntime-web <= 1.20, which had no ConvInteger for int8 weights. The onnxruntime-node and
        # -web that transformers.js 4 ships run it, so our int8 is both: written once as
        # ``*_quantized.onnx`` and hard-linked as ``*_int8.onnx``.
        VariantSpec("int8", "8-bit dynamic quantization: int8 weights per channel, uint8 activations",
                    Tolerance(max_abs=INF, min_cosine=0.98), ("q8", "int8"), maker="int8",
                    options={"weight_type": "int8"}, quantization="dynamic QInt8 per-channel"),  # fmt: skip
        # Opt-in: one more quantization, verification and benchmark, for runtimes that ask for it by name, and for
        # x86 CPUs without VNNI or AMX, where ONNX Runtime saturates int8's products and not uint8's (node.int8_saturates).
        VariantSpec("uint8", "8-bit dynamic quantization: uint8 weights per channel, uint8 activations",
                    Tolerance(max_abs=INF, min_cosine=0.98), ("uint8",), default=False, maker="int8",
                    options={"weight_type": "uint8"}, quantization="dynamic QUInt8 per-channel"),  # fmt: skip
        VariantSpec("q4", "4-bit weight-only quantization of the MatMuls (MatMulNBits, blocks of 32)",
                    Tolerance(max_abs=INF, min_cosine=Q4_MIN_COSINE), ("q4",), default=False, maker="q4",
                    quantization="weight-only 4-bit MatMulNBits, symmetric blocks of 32"),  # fmt: skip
    )
}


def maker(spec: VariantSpec) -> Maker:
    """The function that makes ``spec`` from the plain export (its module imported now, in the job's child)."""
    if spec.maker is None:
        raise ValueError(f"{spec.name} is made by the optimize stage itself, not from the plain export")
    made: Maker = importlib.import_module(f"{__name__}.{spec.maker}").make
    return made

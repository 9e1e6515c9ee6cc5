"""int8 and uint8: dynamic 8-bit quantization of the plain export, per output channel (:mod:`.quantize`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import OptimizeError
from .quantize import default_exclude, load_lazily, quantize


def make(plain: Path, out: Path, external: bool, weight_type: str = "int8") -> tuple[Path, dict[str, Any]]:
    """Dynamic 8-bit quantization of the plain export, streamed one weight at a time (:mod:`zoo_convert.variants.quantize`).

    Every MatMul with a constant weight, per output channel (all-MiniLM-L6-v2 on real text:
    cosine 0.990 vs optimum's ``--avx512_vnni`` per-tensor 0.921, at its latency); the
    embedding lookups stay float, and so do the MatMuls of two activations. Quantizing
    attention's probabilities times V costs MiniLM's cosine on 512-token passages 0.987 ->
    0.948; quantizing the rest of them (``activations="scores"``: Q.K^T, and products such
    as SigLIP's image-by-text logits) gained 1-2 % of bert-base's and gpt2's int8 latency on
    a Zen 4 EPYC but failed the zoo's SigLIP and took qwen3, olmo2 and gemma3's cosine from
    0.9996-0.9999 to 0.992-0.994 (docs/benchmarks.md). int8 has signed weights, uint8 unsigned ones;
    activations are uint8 in both (dynamic quantization has no other).
    """
    done = quantize(
        plain,
        out,
        weight_type="uint8" if weight_type == "uint8" else "int8",
        per_channel=True,
        exclude=default_exclude(load_lazily(plain)),
        external=external,
    )
    quantized = {op: n for op, n in done.ops.items() if op in ("DynamicQuantizeLinear", "MatMulInteger", "ConvInteger") and n}
    if not quantized:
        raise OptimizeError("nothing to quantize: no MatMul, Gemm or Conv with a constant float32 weight")
    details: dict[str, Any] = {
        "quantization": "dynamic",
        "per_channel": True,
        "weight_type": "QUInt8" if weight_type == "uint8" else "QInt8",
        "quantized_ops": quantized,
        "float32_matmuls": done.float_matmuls,
    }
    return out, {**details, "float32_convs": done.float_convs} if done.float_convs else details

"""q4: 4-bit block-wise weight-only quantization of the plain export's MatMuls (``MatMulNBits``), as transformers.js's."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx

from .. import onnx_graph
from ..errors import OptimizeError

# transformers.js's q4 (its scripts/quantize.py): symmetric blocks of 32 weights, ORT's default accuracy level.
BLOCK_SIZE = 32
_NBITS_MODULE = "onnxruntime.quantization.matmul_nbits_quantizer"


def make(plain: Path, out: Path, external: bool) -> tuple[Path, dict[str, Any]]:
    """4-bit weight-only quantization of the plain export's MatMuls with a constant weight (``MatMulNBits``).

    Weight-only: activations stay float32. The plain export, not the fused one: the fusers fold
    the Q/K/V MatMuls into Attention nodes, which MatMulNBits cannot reach. Gather (embeddings),
    Gemm and Conv weights stay float32.
    """
    with _quiet_root(), _quiet(_NBITS_MODULE):  # it logs every node it visits at INFO
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        quantizer = MatMulNBitsQuantizer(onnx.load(str(plain)), bits=4, block_size=BLOCK_SIZE, is_symmetric=True)
        quantizer.process()
    census = onnx_graph.op_census(quantizer.model.model.graph)  # before saving: no second read of it
    if not census["MatMulNBits"]:
        raise OptimizeError("MatMulNBits quantized no MatMul (none has a constant weight)")
    onnx_graph.save(quantizer.model.model, out, external=external)
    return out, {
        "quantization": "weight-only",
        "bits": 4,
        "block_size": BLOCK_SIZE,
        "symmetric": True,
        "quantized_ops": {"MatMulNBits": census["MatMulNBits"]},
        "float32_matmuls": census["MatMul"],
    }


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Hold a library logger at WARNING or above for a while (its INFO lines would flood the job's log)."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(max(logging.WARNING, log.getEffectiveLevel()))
    try:
        yield
    finally:
        log.setLevel(level)


@contextlib.contextmanager
def _quiet_root() -> Iterator[None]:
    """Undo what importing the MatMulNBits quantizer does to the whole process: ``logging.basicConfig(level=INFO)``."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)

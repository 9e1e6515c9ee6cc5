"""Inputs that fit an ONNX graph's declared inputs, built from the model's config.

For tests that compare two graphs of one model (a fused or quantized one against the plain
export) without going through verify's PyTorch references.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from zoo_convert import onnx_graph


def feeds(path: Path, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """Inputs that fit a graph's declared inputs, built from the config: to compare two graphs of one model."""
    rng = np.random.default_rng(0)
    sizes = _dim_sizes(config)
    feeds: dict[str, np.ndarray] = {}
    for inp in onnx_graph.fed_inputs(onnx_graph.load(path).graph):
        tensor = inp.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else _dim(d.dim_param, sizes) for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feeds[inp.name] = _values(inp.name, shape, dtype, config, rng)
    return feeds


def _dim_sizes(config: dict[str, Any]) -> dict[str, int]:
    image = config.get("image_size", 32)
    image = image[0] if isinstance(image, (list, tuple)) else image
    return {
        "batch_size": 2,
        "num_channels": int(config.get("num_channels", 3)),
        "height": int(image),
        "width": int(image),
        "feature_size": int(config.get("num_mel_bins", config.get("feature_size", 80))),
    }


def _dim(name: str, sizes: dict[str, int]) -> int:
    """A symbolic dimension's test size; past lengths differ from current ones to catch mix-ups."""
    if name in sizes:
        return sizes[name]
    if "+" in name:  # optimum writes e.g. "past_sequence_length + sequence_length"
        return sum(_dim(part.strip(), sizes) for part in name.split("+"))
    if "batch" in name:
        return 2
    return 3 if "past" in name else 5


def _values(
    name: str, shape: list[int], dtype: np.dtype, config: dict[str, Any], rng: np.random.Generator
) -> np.ndarray:
    if dtype == np.bool_:
        return np.ones(shape, dtype=bool)  # use_cache_branch: take the with-past branch
    if np.issubdtype(dtype, np.integer):
        if "mask" in name:
            return np.ones(shape, dtype=dtype)
        if "input_ids" in name:
            return rng.integers(0, min(int(config.get("vocab_size", 100)), 100), shape).astype(dtype)
        return np.zeros(shape, dtype=dtype)  # token types, positions: 0 is always valid
    return rng.standard_normal(shape).astype(dtype)

"""What verification compares a variant against, and what one comparison found.

Below both :mod:`zoo_convert.errors` (``NumericsMismatchError`` carries them) and
:mod:`zoo_convert.records` (which records them and re-exports them), so neither
imports the other back.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    """Pass criteria for one variant: every output must meet all of them.

    Attributes:
        max_abs: largest allowed |onnx - torch| over all elements.
        min_cosine: smallest allowed cosine similarity of the flattened outputs.
    """

    max_abs: float
    min_cosine: float = 0.0


@dataclass(frozen=True)
class OutputCheck:
    """ONNX Runtime vs PyTorch on one output at one input shape.

    Attributes:
        output: output name.
        shape: the input shape label, e.g. ``"1x7"``.
        max_abs / max_rel / mean_abs: error statistics.
        cosine: cosine similarity of the flattened tensors.
        nan / inf: count of non-finite values in the ONNX output.
        passed: whether this output met the variant's tolerance.
        mismatch: why the two outputs could not be compared (their shapes differ), or None.
    """

    output: str
    shape: str
    max_abs: float
    max_rel: float
    mean_abs: float
    cosine: float
    nan: int = 0
    inf: int = 0
    passed: bool = True
    mismatch: str | None = None

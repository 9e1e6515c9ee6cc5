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

    Every element is bounded as ``numpy.allclose`` bounds it, ``|onnx - torch| <= max_abs + rtol * |torch|``:
    an absolute part for values near zero and a relative part that follows the reference's scale (a trained
    model's logits in the tens, hidden states in the thousands, boxes in pixels).

    Attributes:
        max_abs: the absolute part of the elementwise bound (``--atol``); inf bounds nothing (int8, q4).
        min_cosine: smallest allowed cosine similarity of the flattened outputs.
        rtol: the relative part of the elementwise bound (``--rtol``), a share of ``|torch|``.
    """

    max_abs: float
    min_cosine: float = 0.0
    rtol: float = 0.0

    def describe(self) -> str:
        """The elementwise bound in words: ``1e-04 + 1e-03·|PyTorch|``, or ``1e-04`` without a relative part."""
        return f"{self.max_abs:g} + {self.rtol:g}·|PyTorch|" if self.rtol else f"{self.max_abs:g}"


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
        bound_used: the largest share of the elementwise bound (``max_abs + rtol·|torch|``) any element's
            difference used: at most 1 passes; 0 where the bound is unbounded (int8, q4).
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
    bound_used: float = 0.0

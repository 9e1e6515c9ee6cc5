"""What verification checks: one ONNX output against its PyTorch reference, judged against a tolerance.

The numbers it returns (:class:`~zoo_convert.checks.OutputCheck`) are what the record keeps;
the verify stage, the generation check and every deployment target judge outputs through
:func:`compare`, so a bound means the same thing wherever it is applied.
"""

from __future__ import annotations

import numpy as np

from ..checks import OutputCheck, Tolerance

# Values compared per step (1 MB of float64 per temporary).
CHUNK = 1 << 17


def peak(ref: np.ndarray) -> float:
    """The largest finite magnitude of a reference (what an error is measured against)."""
    finite = np.abs(ref[np.isfinite(ref)]) if ref.dtype.kind == "f" else np.abs(ref)
    return float(finite.max()) if finite.size else 0.0


def compare(
    output: str, shape: str, ref: np.ndarray, got: np.ndarray, tol: Tolerance, *, keep: np.ndarray | None = None
) -> OutputCheck:
    """Error statistics of one ONNX output against its PyTorch reference, judged against ``tol``.

    ``keep``: where the output holds a token the attention mask keeps; the padded positions
    are not compared. A single value is never judged by cosine alone: the cosine of one
    number against another is 1 whatever they are (their signs alike), so where the
    tolerance bounds no absolute error (int8, q4) its relative error is bounded instead,
    at the error the cosine tolerance allows a vector (:func:`single_value_rel`).
    """
    got = np.asarray(got)
    floating = got.dtype.kind == "f"
    if ref.shape != got.shape:
        nan = int(np.isnan(got).sum()) if floating else 0
        inf = int(np.isinf(got).sum()) if floating else 0
        mismatch = f"shape {dims(got.shape)} in ONNX Runtime, {dims(ref.shape)} in PyTorch"
        return OutputCheck(output, shape, float("inf"), float("inf"), float("inf"), 0.0, nan, inf, passed=False,
                           mismatch=mismatch)  # fmt: skip
    if keep is not None:
        ref, got = ref[keep], got[keep]
    # In chunks that stay in the CPU's cache: over a whole output every step below is a pass over memory, in
    # float64, and whisper-tiny's ~50 M compared values per check made compare cost more than ONNX Runtime's
    # runs (3.7x slower than this, the same figures but the cosine's last bits: sums taken chunk by chunk).
    ref_all, got_all = ref.ravel(), got.ravel()
    bounded = bool(np.isfinite(tol.max_abs))
    nan = inf = finite_mismatch = count = 0
    max_abs = sum_abs = max_rel = rr = gg = rg = used = 0.0
    for start in range(0, ref_all.size, CHUNK):
        got_part = got_all[start : start + CHUNK]
        if floating:
            nan += int(np.isnan(got_part).sum())
            inf += int(np.isinf(got_part).sum())
        r, g = ref_all[start : start + CHUNK].astype(np.float64), got_part.astype(np.float64)
        finite_r, finite_g = np.isfinite(r), np.isfinite(g)
        if not (finite_r.all() and finite_g.all()):
            # Non-finite values only count against ORT where PyTorch had a finite value.
            finite_mismatch += int((finite_r != finite_g).sum())
            both = finite_r & finite_g
            r, g = r[both], g[both]
        if not r.size:
            continue
        diff = np.abs(r - g)
        count += diff.size
        max_abs = max(max_abs, float(diff.max()))
        sum_abs += float(diff.sum())
        max_rel = max(max_rel, float((diff / np.maximum(np.abs(r), 1e-6)).max()))
        rr, gg, rg = rr + float(r @ r), gg + float(g @ g), rg + float(r @ g)
        if bounded:
            used = max(used, bound_used(r, diff, tol))
    mean_abs = sum_abs / count if count else 0.0
    norms = float(np.sqrt(rr) * np.sqrt(gg))
    cosine = float(rg / norms) if norms > 0 else (1.0 if max_abs == 0.0 else 0.0)
    passed = finite_mismatch == 0 and used <= 1.0 and cosine >= tol.min_cosine
    if ref.size == 1 and count and not bounded:
        passed = passed and max_rel <= single_value_rel(tol)
    return OutputCheck(output, shape, max_abs, max_rel, mean_abs, cosine, nan, inf, passed=passed, bound_used=used)


def bound_used(ref: np.ndarray, diff: np.ndarray, tol: Tolerance) -> float:
    """The largest share of its elementwise bound any element's difference uses; the check passes at <= 1.

    The bound is ``numpy.allclose``'s, ``tol.max_abs + tol.rtol * |ref|`` per element, so an output's
    bound follows its own scale: a logit of 25 may differ by 0.025 at fp32's rtol, a value near zero
    by ``max_abs``. An unbounded tolerance (int8, q4: max_abs inf) uses none of it.
    """
    if not diff.size or not np.isfinite(tol.max_abs):
        return 0.0
    bound = tol.max_abs + tol.rtol * np.abs(ref)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(bound > 0, diff / np.where(bound > 0, bound, 1.0), np.where(diff > 0, np.inf, 0.0))
    return float(share.max())


def single_value_rel(tol: Tolerance) -> float:
    """The relative error a single value may have: the error orthogonal to a vector that costs it ``tol``'s cosine.

    ``tan(arccos(min_cosine))``: 0.014 at fp32's 0.9999, 0.2 at int8's 0.98, 0.33 at q4's 0.95.
    """
    c = min(max(tol.min_cosine, 1e-6), 1.0)
    return float(np.sqrt(1.0 - c * c) / c)


def dims(shape: tuple[int, ...]) -> str:
    """A shape as the records write it (``2x4``, ``scalar``)."""
    return "x".join(map(str, shape)) if shape else "scalar"

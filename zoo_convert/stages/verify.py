"""Verify stage: ONNX Runtime against PyTorch, per output, at several input shapes.

Inputs and the PyTorch reference come from :mod:`zoo_convert.runtime`, at every
``settings.verify_shapes`` (batch, sequence) pair rather than the export's dummy
shape, so dynamic axes are exercised, and at one long shape: batch 1 at the
length the model is used at (:mod:`zoo_convert.shapes`), where models that
compute differently past a length threshold show whether the graph kept the
long path. Decoders run with a populated past (past length = sequence), and a
merged decoder is checked on both of its branches. A variant that misses its
tolerance raises :class:`NumericsMismatchError`, which carries every check for
the record; one that missed it at the long shape only says so (``long inputs only``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import shapes
from ..errors import NumericsMismatchError, VerifyError, is_our_bug
from ..records import OutputCheck, Settings, Tolerance
from ..runtime import Case, cases, feed_for, session_for
from . import Artifact, Component, ExportedModel

if TYPE_CHECKING:
    from onnxruntime import InferenceSession


def verify(exported: ExportedModel, artifact: Artifact, settings: Settings) -> tuple[OutputCheck, ...]:
    """Compare ``artifact`` against PyTorch at every verify shape; NumericsMismatchError when it misses its tolerance."""
    tol = settings.tolerances.get(artifact.variant)
    if tol is None:
        raise VerifyError(f"no tolerance configured for variant {artifact.variant!r}")
    prefix = len(exported.components) > 1
    checks: list[OutputCheck] = []
    at_long: dict[tuple[str, str], str] = {}  # (output, shape) checked at the long shape -> what its length counts
    for comp in exported.components:
        session = session_for(exported, artifact, comp, settings)
        done: set[str] = set()
        for shape in shapes.verify_shapes(comp.onnx_config, exported.checkpoint.path, settings):
            found = cases(exported, comp, shape.batch, shape.sequence, settings, audio_samples=shape.audio_samples)
            # A whisper encoder's long shape is its 30 s window again: checked once.
            for case in (c for c in found.values() if c.label not in done):
                done.add(case.label)
                for name, ort_value in _run_ort(session, case, comp).items():
                    output = f"{comp.name}/{name}" if prefix else name
                    checks.append(compare(output, case.label, case.reference[name], ort_value, tol))
                    if shape.long:
                        at_long[output, case.label] = shapes.length_unit(comp.onnx_config)
    failed = [c for c in checks if not c.passed]
    if failed:
        worst = max(failed, key=lambda c: (np.nan_to_num(c.max_abs, nan=np.inf), -c.cosine))
        long_only = None
        if all((c.output, c.shape) in at_long for c in failed):
            long_only = f"{worst.shape} (batch x {at_long[worst.output, worst.shape]})"
        raise NumericsMismatchError(worst=worst, tolerance=tol, checks=tuple(checks), long_only=long_only)
    return tuple(checks)


def compare(output: str, shape: str, ref: np.ndarray, got: np.ndarray, tol: Tolerance) -> OutputCheck:
    """Error statistics of one ONNX output against its PyTorch reference, judged against ``tol``."""
    got = np.asarray(got)
    floating = got.dtype.kind == "f"
    nan = int(np.isnan(got).sum()) if floating else 0
    inf = int(np.isinf(got).sum()) if floating else 0
    if ref.shape != got.shape:
        return OutputCheck(output, shape, float("inf"), float("inf"), float("inf"), 0.0, nan, inf, passed=False)
    r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    finite_r, finite_g = np.isfinite(r), np.isfinite(g)
    # Non-finite values only count against ORT where PyTorch had a finite value.
    finite_mismatch = int((finite_r != finite_g).sum())
    both = finite_r & finite_g
    r, g = r[both], g[both]
    diff = np.abs(r - g)
    max_abs = float(diff.max()) if diff.size else 0.0
    mean_abs = float(diff.mean()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(np.abs(r), 1e-6)).max()) if diff.size else 0.0
    norms = float(np.linalg.norm(r) * np.linalg.norm(g))
    cosine = float(r @ g / norms) if norms > 0 else (1.0 if max_abs == 0.0 else 0.0)
    passed = finite_mismatch == 0 and max_abs <= tol.max_abs and cosine >= tol.min_cosine
    return OutputCheck(output, shape, max_abs, max_rel, mean_abs, cosine, nan, inf, passed=passed)


def _run_ort(session: InferenceSession, case: Case, comp: Component) -> dict[str, np.ndarray]:
    graph_outputs = {o.name for o in session.get_outputs()}
    missing = [n for n in case.outputs if n not in case.reference or n not in graph_outputs]
    if missing:
        raise VerifyError(f"{comp.name}: outputs {missing} missing from the graph or from PyTorch at {case.label}")
    names = list(case.outputs)
    try:
        values = session.run(names, feed_for(session, case, comp))
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
        if is_our_bug(exc):
            raise
        raise VerifyError(f"ONNX Runtime failed on {comp.name} at {case.label}: {exc}") from exc
    return dict(zip(names, values))

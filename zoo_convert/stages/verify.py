"""Verify stage: ONNX Runtime against PyTorch, per output, at several input shapes.

Inputs and the PyTorch reference come from :mod:`zoo_convert.runtime`, at every
``settings.verify_shapes`` (batch, sequence) pair rather than the export's dummy
shape, so dynamic axes are exercised. Decoders run with a populated past (past
length = sequence), and a merged decoder is checked on both of its branches.
A variant that misses its tolerance raises :class:`NumericsMismatchError`, which
carries every check for the record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import NumericsMismatchError, VerifyError, is_our_bug
from ..records import OutputCheck, Settings, Tolerance
from ..runtime import Case, cases, feed_for, session_for
from . import Artifact, Component, ExportedModel

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

# Raw-audio models see ``sequence * AUDIO_SAMPLES_PER_STEP`` samples at a verify shape.
AUDIO_SAMPLES_PER_STEP = 1000


def verify(exported: ExportedModel, artifact: Artifact, settings: Settings) -> tuple[OutputCheck, ...]:
    """Compare ``artifact`` against PyTorch at every verify shape; NumericsMismatchError when it misses its tolerance."""
    tol = settings.tolerances.get(artifact.variant)
    if tol is None:
        raise VerifyError(f"no tolerance configured for variant {artifact.variant!r}")
    prefix = len(exported.components) > 1
    checks: list[OutputCheck] = []
    for comp in exported.components:
        session = session_for(exported, artifact, comp, settings)
        for batch, seq in settings.verify_shapes:
            found = cases(exported, comp, batch, seq, settings, audio_samples=seq * AUDIO_SAMPLES_PER_STEP)
            for case in found.values():
                got = _run_ort(session, case, comp)
                for name, ort_value in got.items():
                    output = f"{comp.name}/{name}" if prefix else name
                    checks.append(compare(output, case.label, case.reference[name], ort_value, tol))
    failed = [c for c in checks if not c.passed]
    if failed:
        worst = max(failed, key=lambda c: (np.nan_to_num(c.max_abs, nan=np.inf), -c.cosine))
        raise NumericsMismatchError(worst=worst, tolerance=tol, checks=tuple(checks))
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

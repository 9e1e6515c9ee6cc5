"""``ort-cpu``: ONNX Runtime's CPU provider on the saved cases (verify's own check, re-run from the saved reference).

The verdict that makes a variant ``passed`` stays verify's (with generation); this target is what
``verify-target`` re-checks after an ONNX Runtime upgrade, and the class the GPU targets build on.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import TargetError, TargetNotRun, is_our_bug
from .base import Loaded, Outputs, Target
from .reference import SavedCase

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

_ORT_FLOAT = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


class OrtLoaded(Loaded):
    """One ONNX Runtime session per component, on the providers asked; ``providers`` says which it really got."""

    def __init__(self, sessions: dict[str, InferenceSession], providers: str, wanted: str | None) -> None:
        self.sessions = sessions
        self.providers = providers
        self.wanted = wanted

    def run(self, case: SavedCase) -> Outputs:
        session = self.sessions.get(case.component)
        if session is None:
            raise TargetError(f"the variant has no graph for component {case.component!r}")
        feed: dict[str, Any] = {}
        for spec in session.get_inputs():
            if spec.name not in case.feed:
                raise TargetError(f"{case.component}: graph input {spec.name!r} has no saved value")
            value = case.feed[spec.name]
            dtype = _ORT_FLOAT.get(spec.type)
            feed[spec.name] = value.astype(dtype) if dtype is not None and value.dtype != dtype else value
        names = [o.name for o in case.outputs]
        try:
            values = session.run(names, feed)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            if is_our_bug(exc):
                raise
            raise TargetError(f"ONNX Runtime failed: {exc}") from exc
        return dict(zip(names, values))

    def close(self) -> None:
        self.sessions.clear()


class OrtCpu(Target):
    """ONNX Runtime on its CPU execution provider."""

    name = "ort-cpu"
    provider = "CPUExecutionProvider"

    def version(self) -> str | None:
        try:
            import onnxruntime
        except ImportError:
            return None
        return str(onnxruntime.__version__)

    def unavailable(self) -> str | None:
        if self.version() is None:
            return f"{self.name}: onnxruntime is not installed on this node"
        import onnxruntime as ort

        available = ort.get_available_providers()
        if self.provider not in available:
            return (f"{self.name}: this onnxruntime build has no {self.provider}"
                    f" (it has {', '.join(available)})")  # fmt: skip
        return None

    def provider_options(self, variant: str) -> list[Any]:
        """The providers a session of ``variant`` is asked for, in preference order (names, or (name, options));
        the GPU targets keep the CPU as ONNX Runtime's own fallback."""
        return [self.provider]

    def load(self, folder: Path, variant: str, files: dict[str, Path]) -> Loaded:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        sessions = {}
        used: list[str] = []
        options: dict[str, dict[str, str]] = {}
        for comp, path in files.items():
            try:
                session = ort.InferenceSession(str(path), sess_options=opts, providers=self.provider_options(variant))
            except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
                if is_our_bug(exc):
                    raise
                raise TargetError(f"ONNX Runtime cannot load {Path(path).name}: {exc}") from exc
            sessions[comp] = session
            used += [p for p in session.get_providers() if p not in used]
            options.update(session.get_provider_options())
        if self.provider not in used:
            # ONNX Runtime fell back silently: whatever it computes is not this target's result.
            raise TargetNotRun(f"{self.name}: ONNX Runtime fell back to {', '.join(used)}; {self.provider} did not load,"
                               " so no result is recorded as this target's")  # fmt: skip
        # The precision mode a provider really ran in is part of what ran it (CUDA's TF32 math, say).
        named = [f"{p} (use_tf32={options[p]['use_tf32']})" if "use_tf32" in options.get(p, {}) else p for p in used]
        return OrtLoaded(sessions, ",".join(named), self.provider)

"""``openvino``: the openvino package's CPU plugin on the saved cases.

fp32 is compiled at ``INFERENCE_PRECISION_HINT = f32``: OpenVINO's default on a CPU with
AVX512-BF16 or AMX is bf16, which moves a right fp32 graph's outputs by 0.3-4 % of their peak,
and a precision hint is never to be read as a bad export. fp16 and int8 variants are compiled at
the same hint and judged at their own variant's tolerance: the graph's own precision is what
they test. One inference thread, as verify's ONNX Runtime sessions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TargetError, is_our_bug
from .base import Loaded, Outputs, Target
from .reference import SavedCase

DEVICE = "CPU"
CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": "1"}


class OpenVINOLoaded(Loaded):
    """One compiled model per component."""

    def __init__(self, compiled: dict[str, Any]) -> None:
        self.compiled = compiled
        self.requests = {comp: model.create_infer_request() for comp, model in compiled.items()}
        self.providers = f"{DEVICE} (inference precision f32)"

    def run(self, case: SavedCase) -> Outputs:
        model = self.compiled.get(case.component)
        if model is None:
            raise TargetError(f"the variant has no graph for component {case.component!r}")
        feed: dict[str, np.ndarray] = {}
        for port in model.inputs:
            # A port has every name the graph gave its tensor (an fp16 graph's input is also its Cast's input).
            name = next((n for n in sorted(port.get_names()) if n in case.feed), port.get_any_name())
            if name not in case.feed:
                raise TargetError(f"{case.component}: graph input {name!r} has no saved value")
            value = case.feed[name]
            want = port.get_element_type().to_dtype()
            feed[name] = value.astype(want) if value.dtype != want else value
        by_name = {n: i for i, port in enumerate(model.outputs) for n in port.get_names()}
        try:
            result = self.requests[case.component].infer(feed)
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises RuntimeError with its own text
            if is_our_bug(exc):
                raise
            raise TargetError(f"OpenVINO failed: {_first(exc)}") from exc
        values = list(result.values())
        return {o.name: np.array(values[by_name[o.name]]) for o in case.outputs if o.name in by_name}

    def close(self) -> None:
        self.requests.clear()
        self.compiled.clear()


class OpenVINO(Target):
    """OpenVINO's CPU plugin, reading the ONNX graphs with its ONNX frontend."""

    name = "openvino"
    standard_ops = True  # ONNX Runtime's contrib ops (FusedMatMul, QuickGelu, ...) translate badly or not at all

    def version(self) -> str | None:
        try:
            from importlib.metadata import version

            return version("openvino")
        except Exception:  # noqa: BLE001 - not installed
            return None

    def preload(self) -> None:
        # ~0.2 CPU s (0.6-1 s on a busy 2-core node) a job's openvino child would otherwise pay. Forking after
        # it is safe: the children compile and run with their own pools (tests/targets/test_cost.py).
        import openvino  # noqa: F401

    def load(self, folder: Path, variant: str, files: dict[str, Path]) -> Loaded:
        import openvino as ov

        core = ov.Core()
        compiled = {}
        for comp, path in files.items():
            try:
                compiled[comp] = core.compile_model(str(path), DEVICE, CONFIG)
            except Exception as exc:  # noqa: BLE001 - OpenVINO raises RuntimeError with its own text
                if is_our_bug(exc):
                    raise
                raise TargetError(f"OpenVINO cannot compile {Path(path).name}: {_first(exc)}") from exc
        return OpenVINOLoaded(compiled)


def _first(exc: BaseException) -> str:
    """OpenVINO's message without its C++ source locations and check banners: the lines that say what failed."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(("Check '", "Exception from src", "[ GENERAL_ERROR ]"))]
    return " ".join(useful or lines)[:600]

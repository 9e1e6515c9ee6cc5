"""``ort-cuda`` and ``ort-tensorrt``: ONNX Runtime's GPU providers, only where this node's build has them.

ONNX Runtime falls back to the CPU without a word when a provider cannot load (no device, a
missing CUDA library): the session's own providers are recorded, and a session that did not get
the target's provider is ``not-run``, never a GPU result (:meth:`OrtCpu.load`). On a node without
``onnxruntime-gpu`` these targets are not installed, so a default run never asks for them.
"""

from __future__ import annotations

import glob
from typing import Any

from .ort_cpu import OrtCpu


def gpu_devices() -> list[str]:
    """The NVIDIA devices this node has (``/dev/nvidia0`` ...): none means no GPU target is installed here."""
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


class _OnGpu(OrtCpu):
    gpu = True

    def unavailable(self) -> str | None:
        why = super().unavailable()
        if why is None and not gpu_devices():
            return f"{self.name}: no GPU on this node"
        return why


class OrtCuda(_OnGpu):
    """ONNX Runtime on its CUDA execution provider (CPU as the fallback ONNX Runtime itself would take)."""

    name = "ort-cuda"
    provider = "CUDAExecutionProvider"

    def provider_options(self) -> list[Any]:
        return [self.provider, "CPUExecutionProvider"]


class OrtTensorRT(_OnGpu):
    """ONNX Runtime on its TensorRT execution provider (CUDA, then CPU, for the nodes TensorRT does not take)."""

    name = "ort-tensorrt"
    provider = "TensorrtExecutionProvider"

    def provider_options(self) -> list[Any]:
        return [self.provider, "CUDAExecutionProvider", "CPUExecutionProvider"]

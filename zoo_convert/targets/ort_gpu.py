"""``ort-cuda`` and ``ort-tensorrt``: ONNX Runtime's GPU providers, only where this node's build has them.

ONNX Runtime falls back to the CPU without a word when a provider cannot load (no device, a
missing CUDA library): the session's own providers are recorded, and a session that did not get
the target's provider is ``not-run``, never a GPU result (:meth:`OrtCpu.load`). On a node without
``onnxruntime-gpu`` these targets are not installed, so a default run never asks for them.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import io
from typing import Any

from .ort_cpu import OrtCpu


def gpu_devices() -> list[str]:
    """The NVIDIA devices this node has (``/dev/nvidia0`` ...): none means no GPU target is installed here."""
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


@functools.cache
def preload_cuda() -> str:
    """Load the CUDA and cuDNN libraries from the nvidia wheels beside onnxruntime-gpu (its own ``preload_dlls``).

    A farm job imports torch first, which loads them; ``verify-target`` on a GPU node imports no torch, and
    without this ONNX Runtime finds no libcublas, falls back to the CPU and the row is ``not-run``. What
    ``preload_dlls`` prints (it reports a missing library on stdout) is returned, never mixed into ``--json``.
    """
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)  # onnxruntime-gpu >= 1.21
    if preload is None:
        return ""
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        preload()
    return said.getvalue().strip()


@functools.cache
def providers_that_load(providers: tuple[str, ...]) -> tuple[str, ...]:
    """The providers ONNX Runtime really gives a one-node session asked for ``providers``.

    A provider "available" in the build can still fail to load (TensorRT's libnvinfer missing, say): ONNX
    Runtime logs it and falls back. Asked once per process, so such a node's rows are all ``not-run`` with
    that reason, never a variant's ``failed`` for a session that could not even start on the target.
    """
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return tuple(ort.InferenceSession(model.SerializeToString(), providers=list(providers)).get_providers())


class _OnGpu(OrtCpu):
    gpu = True
    # The fused graph holds ONNX Runtime's CPU fusions (FusedConv with activations CUDA has no kernel for: 13 of
    # 139 zoo models did not load on an H200); the standard graph is fused by the GPU provider itself.
    standard_ops = True
    # The providers a session asks for, in order: the target's, then what ONNX Runtime itself would fall back to.
    chain: tuple[str, ...] = ()

    def provider_options(self, variant: str) -> list[Any]:
        # CUDA runs fp32 MatMuls and attention in TF32 by default (10 bits of mantissa on Ampere and later): on an
        # H200 that put 13 of 25 tiny fp32 models 1e-4 to 3e-3 off PyTorch at cosine 1.000000. An fp32 variant is
        # judged at fp32, as OpenVINO's is at its f32 hint: a math mode is never mistaken for a bad export.
        cuda = {"use_tf32": "0" if variant == "fp32" else "1"}
        return [(p, cuda) if p == "CUDAExecutionProvider" else p for p in self.chain]

    def unavailable(self) -> str | None:
        why = super().unavailable()
        if why is None and not gpu_devices():
            return f"{self.name}: no GPU on this node"
        if why is None:
            said = preload_cuda()  # before any session: a farm job has the libraries from torch, verify-target not
            got = providers_that_load(self.chain)
            if self.provider not in got:
                return (f"{self.name}: {self.provider} does not load on this node (ONNX Runtime falls back to"
                        f" {', '.join(got)}){' - ' + said[:300] if said else ''}")  # fmt: skip
        return why


class OrtCuda(_OnGpu):
    """ONNX Runtime on its CUDA execution provider (CPU as the fallback ONNX Runtime itself would take)."""

    name = "ort-cuda"
    provider = "CUDAExecutionProvider"
    chain = (provider, "CPUExecutionProvider")


class OrtTensorRT(_OnGpu):
    """ONNX Runtime on its TensorRT execution provider (CUDA, then CPU, for the nodes TensorRT does not take)."""

    name = "ort-tensorrt"
    provider = "TensorrtExecutionProvider"
    chain = (provider, "CUDAExecutionProvider", "CPUExecutionProvider")

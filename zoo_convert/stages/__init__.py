"""Pipeline stages, one module each, and the in-memory objects passed between them.

    fetch     ManifestEntry            -> Checkpoint
    export    Checkpoint               -> ExportedModel      (onnx/model.onnx, ...)
    check     ExportedModel            -> details            (onnx.checker + shape inference)
    optimize  ExportedModel            -> {variant: Artifact} (fp32 optimized, fp16, int8, uint8, q4)
    verify    ExportedModel            -> references         (PyTorch's outputs at every shape, once per job)
              ExportedModel, Artifact  -> (OutputCheck, ...)  (ORT vs PyTorch at >= 2 shapes; run by
                                                              optimize's child as it makes each variant)
    benchmark ExportedModel, [Artifact] -> {variant: Latency} (ORT and PyTorch eager, interleaved)

No stage imports another: what several share lives a layer below, in
:mod:`zoo_convert.onnx_graph` (graphs on disk), :mod:`zoo_convert.verify.runtime`
(sessions, inputs, the PyTorch reference) and :mod:`zoo_convert.job`, where these
objects are defined (re-exported here); what survives the process is the
``records.ConversionResult``.
"""

from __future__ import annotations

from ..job import (
    Artifact,
    Check,
    Checkpoint,
    Component,
    ExportedModel,
    Latency,
    Timing,
    Verified,
)

__all__ = [
    "Artifact",
    "Check",
    "Checkpoint",
    "Component",
    "ExportedModel",
    "Latency",
    "Timing",
    "Verified",
]

"""Pipeline stages, one module each, and the in-memory objects passed between them.

    fetch     ManifestEntry            -> Checkpoint
    export    Checkpoint               -> ExportedModel      (onnx/model.onnx, ...)
    check     ExportedModel            -> details            (onnx.checker + shape inference)
    optimize  ExportedModel            -> {variant: Artifact} (fp32 optimized, fp16, int8, uint8, q4)
    verify    ExportedModel, Artifact  -> (OutputCheck, ...)  (ORT vs PyTorch at >= 2 shapes)
    benchmark ExportedModel, Artifact  -> Latency            (ORT and PyTorch eager p50/p90)

No stage imports another: what several share lives a layer below, in
:mod:`zoo_convert.onnx_graph` (graphs on disk) and :mod:`zoo_convert.runtime`
(sessions, inputs, the PyTorch reference). These objects live inside one process
(they hold torch modules and optimum configs); what survives the process is the
``records.ConversionResult``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..runtime import ModuleState, RuntimeCache

if TYPE_CHECKING:
    import torch
    from optimum.exporters.onnx import OnnxConfig


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint on local disk, resolved and vetted.

    Attributes:
        path: folder holding config.json and the weights.
        resolved_revision: hub commit sha, or ``sha256:<hex>`` of a local folder's contents.
        model_type: ``config.model_type``.
        task: the task to export (given or inferred from ``config.architectures``).
        library: transformers, sentence_transformers, timm, ...
        config: the parsed config.json.
        trust_remote_code: whether loading may run code from the checkpoint.
    """

    path: Path
    resolved_revision: str
    model_type: str
    task: str
    library: str
    config: dict[str, Any]
    trust_remote_code: bool = False


@dataclass
class Component:
    """One ONNX graph of an export (``model``, ``encoder_model``, ``decoder_model_merged``...).

    Attributes:
        name: the file stem under onnx/ (``model`` -> onnx/model.onnx).
        path: the fp32 .onnx file as exported.
        onnx_config: optimum's OnnxConfig for this component (input/output names,
            dynamic axes, dummy input generators); both exporters set it.
        torch_module: the PyTorch module (patched as for export) that this graph mirrors.
        as_loaded: the loaded model's state before the export ran it, put back before
            every reference forward (shared by the components of one model).
    """

    name: str
    path: Path
    onnx_config: OnnxConfig | None = None
    torch_module: torch.nn.Module | None = None
    as_loaded: ModuleState | None = None


@dataclass
class ExportedModel:
    """The result of the export stage, with the live objects verify needs.

    Attributes:
        checkpoint: what was exported.
        out_dir: the model's artifact folder (holds onnx/ and the copied config files).
        components: one entry per ONNX graph, in the order they run.
        opset / ir_version / node_count / op_census: facts read from the fp32 graph(s).
        files: relative path -> size in bytes of every file written under onnx/.
        details: exporter specifics worth recording.
        cache: what verify and benchmark share (ORT sessions, inputs, PyTorch outputs); never recorded.
    """

    checkpoint: Checkpoint
    out_dir: Path
    components: list[Component]
    opset: int
    ir_version: int
    node_count: int
    op_census: dict[str, int]
    files: dict[str, int] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    cache: RuntimeCache = field(default_factory=RuntimeCache, repr=False, compare=False)


@dataclass
class Artifact:
    """One variant's ONNX files, one per component.

    Attributes:
        variant: one of records.VARIANTS.
        files: component name -> path of that component's graph in this variant.
        details: how it was made (fusion statistics, ``fusion_applied``, quantization mode);
            ``error`` and ``failure_kind`` when it could not be made.
        traceback: where making it failed, for a failure that is a bug of ours.
    """

    variant: str
    files: dict[str, Path]
    details: dict[str, Any] = field(default_factory=dict)
    traceback: str | None = None

    @property
    def size_bytes(self) -> int:
        from .. import onnx_graph  # onnx is for the workers: the farm driver imports this module too

        return sum(onnx_graph.disk_size(p) for p in self.files.values())


@dataclass(frozen=True)
class Latency:
    """Median and 90th percentile latencies in milliseconds."""

    ort_p50_ms: float
    ort_p90_ms: float
    torch_p50_ms: float
    torch_p90_ms: float

    @property
    def speedup(self) -> float:
        return self.torch_p50_ms / self.ort_p50_ms if self.ort_p50_ms > 0 else float("nan")

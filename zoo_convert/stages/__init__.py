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
:mod:`zoo_convert.onnx_graph` (graphs on disk) and :mod:`zoo_convert.runtime`
(sessions, inputs, the PyTorch reference). These objects live inside one process
(they hold torch modules and optimum configs); what survives the process is the
``records.ConversionResult``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..records import OutputCheck, Settings
from ..runtime import ModuleState, RuntimeCache

if TYPE_CHECKING:
    import onnx
    from ..generation import Generation
    import torch
    from optimum.exporters.onnx import OnnxConfig


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint on local disk, resolved and vetted.

    Attributes:
        path: folder holding config.json and the weights (a diffusers pipeline: model_index.json and its component folders).
        resolved_revision: hub commit sha, or ``sha256:<hex>`` of a local folder's contents.
        model_type: ``config.model_type``.
        task: the task to export (given or inferred from ``config.architectures``).
        library: transformers, sentence_transformers, timm, ...
        config: the parsed config.json (a pipeline's model_index.json).
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
        name: the file stem under onnx/ (``model`` -> onnx/model.onnx); a diffusers pipeline's
            component folder (``unet`` -> unet/model.onnx).
        path: the fp32 .onnx file as exported.
        onnx_config: optimum's OnnxConfig for this component (input/output names,
            dynamic axes, dummy input generators); both exporters set it.
        torch_module: the PyTorch module as loaded that this graph mirrors (verify runs it unpatched).
        as_loaded: the loaded model's state before the export ran it, put back before
            every reference forward (shared by the components of one model).
        graph: the exported graph without its weights (the job keeps them in ``<file>_data``
            beside it): read once, for the op census, the input names and the fusion's census.
        model_type: the component's own model type where it is not the checkpoint's (a diffusers
            pipeline's ``clip-text``, ``unet-2d-condition``, ``vae-decoder``): optimize picks its fuser by it.
    """

    name: str
    path: Path
    onnx_config: OnnxConfig | None = None
    torch_module: torch.nn.Module | None = None
    as_loaded: ModuleState | None = None
    model_type: str | None = None
    _graph: onnx.ModelProto | None = field(default=None, repr=False, compare=False)

    @property
    def graph(self) -> onnx.ModelProto:
        if self._graph is None:
            from .. import onnx_graph  # onnx is for the workers: the farm driver imports this module too

            self._graph = onnx_graph.load(self.path)
        return self._graph

    def release_torch(self) -> None:
        """Drop the torch module: the job needs PyTorch no more (its references are computed)."""
        self.torch_module = None
        self.as_loaded = None


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
        verified: ONNX Runtime's side of verify, run by the child that made it, per component;
            empty when optimize ran without PyTorch references.
    """

    variant: str
    files: dict[str, Path]
    details: dict[str, Any] = field(default_factory=dict)
    traceback: str | None = None
    verified: dict[str, Verified] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        from .. import onnx_graph  # onnx is for the workers: the farm driver imports this module too

        return sum(onnx_graph.disk_size(p) for p in self.files.values())


@dataclass(frozen=True)
class Verified:
    """ONNX Runtime against the PyTorch references for one component of one variant.

    Attributes:
        checks: every output check made (all of them when it ran; those before the failure otherwise).
        seconds: how long the checks took (sessions, runs, comparisons).
        error: why it could not run every check (an ONNX Runtime failure at one input); None when it did.
        error_kind: the failure kind of ``error``.
        traceback: where ``error`` was raised, for a bug of ours.
        generation: ONNX Runtime's generation against PyTorch's, for the component that generates
            (its step checks are among ``checks``); None for any other.
    """

    checks: tuple[OutputCheck, ...]
    seconds: float
    error: str | None = None
    error_kind: str | None = None
    traceback: str | None = None
    generation: Generation | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and all(c.passed for c in self.checks)


# verify's ONNX Runtime side of one component of one artifact (``verify.check``), handed to
# optimize by the pipeline: no stage imports another.
Check = Callable[["ExportedModel", "Artifact", "Component", Settings], Verified]


@dataclass(frozen=True)
class Timing:
    """One side's latency of one forward pass.

    Attributes:
        p50_ms / p90_ms: median and 90th percentile, milliseconds.
        runs: timed calls.
        spread: interquartile range over the median (IQR / p50).
    """

    p50_ms: float
    p90_ms: float
    runs: int
    spread: float


@dataclass(frozen=True)
class Latency:
    """One variant's latency beside PyTorch's, and the conditions both were measured under.

    Attributes:
        ort / torch: the timings; None where that side could not be timed (``note`` says why).
        threads: intra-op threads of both sides.
        shape: batch x length of the timed input (the first component's).
        cpu: the CPU model (and its int8 instruction sets).
        load: the 1-minute load average during the measurement (the highest sampled).
        noisy: the spread of a side or the load was too high to trust the figures.
        note: why a side has no timing.
        traceback: where timing failed, for a bug of ours.
    """

    ort: Timing | None
    torch: Timing | None
    threads: int
    shape: str
    cpu: str
    load: float
    noisy: bool = False
    note: str | None = None
    traceback: str | None = None

    @property
    def speedup(self) -> float | None:
        if self.ort is None or self.torch is None or self.ort.p50_ms <= 0:
            return None
        return self.torch.p50_ms / self.ort.p50_ms

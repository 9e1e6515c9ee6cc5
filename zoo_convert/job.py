"""The in-memory objects of one job: what the stages pass between them and what they share.

    Checkpoint -> ExportedModel (Components, each with its graph, OnnxConfig and torch module)
               -> Artifact per variant -> Verified (its checks) and Latency (its Timings)
    RuntimeCache on ExportedModel.cache: sessions, Cases (inputs and PyTorch outputs) per shape

Below both :mod:`zoo_convert.stages` (which re-exports the stage objects) and
:mod:`zoo_convert.verify.runtime` (which makes and reads the cases), so neither imports the other
back. These objects live inside one process (they hold torch modules, optimum configs and
ONNX Runtime sessions); what survives it is the ``records.ConversionResult``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .records import OutputCheck, Settings

if TYPE_CHECKING:
    import onnx
    import torch
    from onnxruntime import InferenceSession
    from optimum.exporters.onnx import OnnxConfig
    from transformers import PreTrainedTokenizerBase


class Branch(str, Enum):
    """Which graph of a component a case runs: the whole graph, or one branch of a merged decoder."""

    WHOLE = ""
    NO_CACHE = "no-cache"  # the first decoding step: no past yet
    CACHE = "cache"  # every later step: the past of the steps before


@dataclass(frozen=True)
class Generation:
    """ONNX Runtime's generation against PyTorch's, for one variant.

    Attributes:
        steps: decoding steps compared (teacher-forced on PyTorch's tokens).
        checks: the logits check of every step (they are also among the variant's checks).
        token_match: share of ORT's own greedy tokens identical to PyTorch's, position by position.
        first_mismatch: the first step whose greedy token differs (None when all agree).
        tie: PyTorch's two candidates at ``first_mismatch`` are closer than the tolerance.
        note: why generation was not checked (then nothing else is set).
    """

    steps: int = 0
    checks: tuple[OutputCheck, ...] = ()
    token_match: float | None = None
    first_mismatch: int | None = None
    tie: bool = False
    note: str | None = None

    @property
    def max_abs(self) -> float | None:
        return max(c.max_abs for c in self.checks) if self.checks else None

    @property
    def min_cosine(self) -> float | None:
        return min(c.cosine for c in self.checks) if self.checks else None

    def summary(self) -> dict[str, Any]:
        """The record's view of it (a VariantResult's ``generation_*`` fields)."""
        return {
            "generation_steps": self.steps or None,
            "generation_max_abs": self.max_abs,
            "generation_min_cosine": self.min_cosine,
            "generation_token_match": self.token_match,
            "generation_note": self.note or (
                f"greedy tokens diverged at step {self.first_mismatch} on a near tie: PyTorch's two candidates"
                " there are closer than the tolerance" if self.tie else None
            ),
        }


@dataclass
class Case:
    """One component's inputs at one shape, and PyTorch's outputs for them.

    Attributes:
        label: the shape label recorded in OutputCheck.shape: batch x length (tokens; the
            frames or samples of an audio encoder), and the branch (``3x19``, ``1x7/cache``).
        branch: which graph of the component it runs.
        torch_inputs: keyword arguments of the torch module's forward.
        feed: ONNX Runtime inputs by graph input name (fp32 / int64 numpy).
        reference: PyTorch outputs by ONNX output name.
        outputs: the graph outputs this case checks (a merged decoder's cache branch
            passes the constant cross-attention cache through unchecked, as optimum does).
        config: the OnnxConfig (branch) that generated it; its patcher feeds and reads the torch module.
        keep: per output whose tokens the attention mask pads, where the mask keeps a token
            (boolean, the reference's shape); outputs without padding are not listed.
    """

    label: str
    branch: Branch
    torch_inputs: dict[str, Any]
    feed: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]
    outputs: tuple[str, ...]
    config: OnnxConfig
    keep: dict[str, np.ndarray] = field(default_factory=dict)


# (graph file, intra-op threads, providers)
SessionKey = tuple[str, int, tuple[str, ...]]
# (component, *sorted dummy-generator shape arguments): the shape as fed
CaseKey = tuple[str | tuple[str, int], ...]


@dataclass(frozen=True)
class Ahead:
    """PyTorch's outputs for one case, computed in a child forked before the export (``RuntimeCache.ahead``).

    Attributes:
        inputs: a digest of the torch inputs it was fed: used only where the job's own inputs for the case are these.
        outputs: the outputs the case checks, as the component's config named them then.
        found: PyTorch's outputs by ONNX output name.
        again: the second forward's, for a component's first case (whether the model samples); else None.
    """

    inputs: str
    outputs: tuple[str, ...]
    found: dict[str, np.ndarray]
    again: dict[str, np.ndarray] | None


@dataclass(frozen=True)
class GenerationAhead:
    """PyTorch's greedy generation computed in that child (``verify.generation.reference_ahead``).

    Attributes:
        decoder: the component that generated.
        inputs: a digest of generate()'s inputs: used only where the job's own are these.
        tokens: the tokens after the prompt; logits: the logits at every step.
    """

    decoder: str
    inputs: str
    tokens: np.ndarray
    logits: np.ndarray


@dataclass
class RuntimeCache:
    """What one job's verify and benchmark stages share; lives on ``ExportedModel.cache``, never recorded.

    Attributes:
        sessions: ONNX Runtime sessions by graph file, threads and providers (a verifying
            child's own; the job's process opens its sessions in the benchmark and closes them there).
        cases: inputs and PyTorch outputs per component and shape, one Case per branch.
        references_done: every case the job needs is computed (``verify.references``); from
            then on no PyTorch forward may run, as forked children read these cases.
        failed: the cases whose inputs or PyTorch forward failed, by key: asked again, the same
            error is raised (after ``references_done`` there is no second try).
        tokenizer: the checkpoint's tokenizer, None when it has no usable one.
        tokenizer_loaded: whether ``tokenizer`` was looked for yet.
        pipeline_tokenizers: the tokenizers a diffusers pipeline loaded, by folder (``tokenizer_2``).
        unrepeatable: components whose PyTorch forward gave other outputs the second time on
            the same input (a model that samples), with the outputs that differed.
        torch_alone: a big model's PyTorch timing, taken before optimize so the torch model is not
            held through it (``benchmark.time_torch_alone``): milliseconds per call, or why it
            could not be timed, and the load average around it; None when PyTorch is timed with the variants.
        generation: PyTorch's greedy generation (:mod:`zoo_convert.verify.generation`), memoized; None before it ran.
        ahead: PyTorch's outputs per case and branch, computed beside the export (:func:`zoo_convert.stages.verify.references_ahead`).
        generation_ahead: PyTorch's greedy generation computed there too, until the job's generation takes it.
        torch_only: this is that child: cases are PyTorch's side alone, into ``ahead`` (no graph exists yet).
        encoded: by the encoder graph's path where it ships, the generation prompt's encoding, from that graph's own
            check (``Verified.encoded``): a decoder's generation check that reads that graph takes it instead of
            opening it again (whisper-tiny: a session and 1.1 s of one CPU a variant, at 30 s of audio); keyed by
            the file, so a check handed another encoder graph encodes with that one.
    """

    sessions: dict[SessionKey, InferenceSession] = field(default_factory=dict)
    cases: dict[CaseKey, dict[Branch, Case]] = field(default_factory=dict)
    references_done: bool = False
    failed: dict[CaseKey, Exception] = field(default_factory=dict)
    tokenizer: PreTrainedTokenizerBase | None = None
    tokenizer_loaded: bool = False
    pipeline_tokenizers: dict[str, PreTrainedTokenizerBase] = field(default_factory=dict)
    unrepeatable: dict[str, tuple[str, ...]] = field(default_factory=dict)
    torch_alone: TorchAlone | None = None
    generation: Any = None
    ahead: dict[tuple[CaseKey, Branch], Ahead] = field(default_factory=dict)
    generation_ahead: GenerationAhead | None = None
    torch_only: bool = False
    encoded: dict[Path, dict[str, np.ndarray]] = field(default_factory=dict)


@dataclass(frozen=True)
class TorchAlone:
    """PyTorch timed on its own before the variants were made (see ``RuntimeCache.torch_alone``)."""

    ms: tuple[float, ...]
    failed: tuple[str, str | None] | None
    load: float


class ModuleState:
    """A torch module tree's Python-level state (attributes, child modules, parameter and buffer slots).

    :meth:`restore` puts back what a forward pass replaced: swapped submodules,
    re-registered buffers, switched flags, and the contents of plain dicts a forward
    fills in place. Tensors are shared, not copied, so it costs a few dicts per
    module; a tensor changed in place stays changed.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self._saved = [
            (m, dict(vars(m)), dict(m._modules), dict(m._parameters), dict(m._buffers)) for m in module.modules()
        ]
        # Caches kept in a plain dict attribute (timm LeViT's ``attention_bias_cache``) are filled
        # in place by a forward: torch.export leaves fake tensors there, and the reference forward
        # then reads them ("Cannot access data pointer of Tensor"). Putting the attribute back is not
        # enough, it is the same dict; its contents are put back.
        self._dicts = [
            (d, dict(d))
            for _, attrs, *_ in self._saved
            for name, d in attrs.items()
            if type(d) is dict and name not in ("_modules", "_parameters", "_buffers")
        ]
        # optimum's patcher sets ``use_cache`` on every submodule's config in place (a T5 encoder's
        # too, which then refuses to run in generate()): the configs are part of the model as loaded.
        configs = {id(c): c for m in module.modules() if (c := getattr(m, "config", None)) is not None}
        self._configs = [(c, dict(vars(c))) for c in configs.values() if hasattr(c, "__dict__")]

    def restore(self) -> None:
        for module, attrs, modules, parameters, buffers in self._saved:
            state = vars(module)
            state.clear()
            state.update(attrs, _modules=dict(modules), _parameters=dict(parameters), _buffers=dict(buffers))
        for config, saved in self._configs:
            vars(config).clear()
            vars(config).update(saved)
        for d, contents in self._dicts:
            d.clear()
            d.update(contents)


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
            from . import (
                onnx_graph,  # onnx is for the workers: the farm driver imports this module too
            )

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
        standard: component name -> a graph of standard ONNX ops computing the same, where the
            component's graph in ``files`` holds ONNX Runtime's contrib ops (``<folder>/standard/``:
            what runtimes other than ONNX Runtime read); checked against PyTorch on ONNX Runtime too.
    """

    variant: str
    files: dict[str, Path]
    details: dict[str, Any] = field(default_factory=dict)
    traceback: str | None = None
    verified: dict[str, Verified] = field(default_factory=dict)
    standard: dict[str, Path] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        from . import (
            onnx_graph,  # onnx is for the workers: the farm driver imports this module too
        )

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
        encoded: this graph's encoding of the generation check's prompt, where it is the encoder of a decoder that
            generates (the decoder's inputs ``encoder_hidden_states`` and ``encoder_attention_mask``): optimize hands
            it to the decoder's children that read this graph (``RuntimeCache.encoded``); never recorded.
    """

    checks: tuple[OutputCheck, ...]
    seconds: float
    error: str | None = None
    error_kind: str | None = None
    traceback: str | None = None
    generation: Generation | None = None
    encoded: dict[str, np.ndarray] | None = field(default=None, repr=False, compare=False)

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
        runs: timed samples (each the mean of as many back-to-back calls as last ``benchmark.SAMPLE_S``).
        spread: interquartile range of the samples over their median (IQR / p50).
        ci: the width of the median's 95 % confidence interval over the median (``benchmark.median_ci``): how well
            the samples pin the median down, which many samples do even where they spread.
    """

    p50_ms: float
    p90_ms: float
    runs: int
    spread: float
    ci: float


@dataclass(frozen=True)
class Latency:
    """One variant's latency beside PyTorch's, and the conditions both were measured under.

    Attributes:
        ort / torch: the timings; None where that side could not be timed (``note`` says why).
        threads: intra-op threads of both sides.
        shape: batch x length of the timed input (the first component's).
        cpu: the CPU model (and its int8 instruction sets).
        load: the 1-minute load average during the measurement (the highest sampled).
        noisy: a side's median was not pinned down (``Timing.ci``) or other processes took the CPUs it needed.
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

    def columns(self) -> dict[str, object]:
        """The record's latency fields (:data:`~zoo_convert.records.LATENCY_FIELDS`), by their names.

        Each side's Timing field is ``<side>_<field>``, each condition ``bench_<field>``.
        """
        from .records import LATENCY_FIELDS

        found: dict[str, object] = {"speedup": self.speedup}
        for side, timing in (("ort", self.ort), ("torch", self.torch)):
            found.update({f"{side}_{f.name}": getattr(timing, f.name) if timing else None for f in fields(Timing)})
        found.update({f"bench_{f.name}": getattr(self, f.name) for f in fields(self) if f.name not in ("ort", "torch", "traceback")})
        if set(found) != set(LATENCY_FIELDS):
            raise AssertionError(f"Latency and VariantResult's latency fields differ: {set(found) ^ set(LATENCY_FIELDS)}")
        return found

    @property
    def speedup(self) -> float | None:
        if self.ort is None or self.torch is None or self.ort.p50_ms <= 0:
            return None
        return self.torch.p50_ms / self.ort.p50_ms

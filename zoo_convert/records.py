"""The farm's data: what goes into a conversion and what comes out.

All records are frozen dataclasses that round-trip through JSON
(:func:`to_json` / :meth:`ConversionResult.from_dict`), because a result crosses
a process boundary (fork child -> Ray worker -> driver) and lands as
``result.json`` beside the artifacts.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from .checks import OutputCheck as OutputCheck
from .checks import Tolerance as Tolerance
from .errors import FailureKind
from .variants import REGISTRY

EXPORTERS = ("optimum", "torch", "auto")
# torch.onnx's supported range (torch/onnx/_constants.py ONNX_MIN_OPSET/ONNX_MAX_OPSET);
# tests check it stays inside what torch and onnx know.
MIN_OPSET, MAX_OPSET = 7, 23
# Every variant the farm can make (variants.REGISTRY says what each is); a manifest row or --variants asks for some.
VARIANTS = tuple(REGISTRY)
# What a job makes when it does not say; the others are opt-in.
DEFAULT_VARIANTS = tuple(name for name, spec in REGISTRY.items() if spec.default)
# transformers.js ``dtype`` -> file name suffix under onnx/ (DEFAULT_DTYPE_SUFFIX_MAPPING in
# its src/utils/dtypes.js); ``model_quantized.onnx`` is also optimum's ORTQuantizer name.
JS_SUFFIXES = {"fp32": "", "fp16": "_fp16", "q8": "_quantized", "int8": "_int8", "uint8": "_uint8", "q4": "_q4"}
# The dtypes each variant's graph answers to (VariantSpec.js_dtypes).
JS_DTYPES = {name: spec.js_dtypes for name, spec in REGISTRY.items()}
# optimum-cli's --optimize levels the optimize stage makes the fp32 graph at (stages/optimize.py says how
# each maps to ONNX Runtime's optimizers, as optimum's AutoOptimizationConfig does). optimum's O4 is O3
# in fp16: here that is the fp16 variant, made from the fp32 graph of whichever level was asked.
OPTIMIZATION_LEVELS = ("O1", "O2", "O3")
DEFAULT_OPTIMIZATION = "O2"
# The input shapes a user may fix for verify and benchmark, spelt as optimum-cli's export options
# (--batch_size, --sequence_length, ...): Settings.shapes. Audio lengths are samples of audio.
SHAPE_OPTIONS = ("batch_size", "sequence_length", "num_choices", "height", "width", "num_channels",
                 "audio_sequence_length", "feature_size", "nb_max_frames")  # fmt: skip


# Beside a component's graphs, the folder of its graphs of standard ONNX ops (``onnx/standard/model.onnx``),
# written where the shipped graph holds ONNX Runtime's contrib ops; same file names, so a loader's
# ``subfolder="onnx/standard"`` finds them.
STANDARD_FOLDER = "standard"

# optimum 2.1 TasksManager.get_all_tasks() plus its _SYNONYM_TASK_MAP keys, frozen here so validating a manifest never
# imports torch (nor convert's --task check pyarrow); tests/test_manifest.py checks it against TasksManager.
TASKS = frozenset(
    {
        "audio-classification", "audio-frame-classification", "audio-xvector", "automatic-speech-recognition",
        "depth-estimation", "document-question-answering", "feature-extraction", "fill-mask",
        "image-classification", "image-segmentation", "image-text-to-text", "image-to-image", "image-to-text",
        "inpainting", "keypoint-detection", "mask-generation", "masked-im", "multiple-choice", "object-detection",
        "question-answering", "reinforcement-learning", "semantic-segmentation", "sentence-similarity",
        "text-classification", "text-generation", "text-to-audio", "text-to-image", "text2text-generation",
        "time-series-forecasting", "token-classification", "visual-question-answering",
        "zero-shot-image-classification", "zero-shot-object-detection",
        # synonyms
        "audio-ctc", "causal-lm", "causal-lm-with-past", "default", "default-with-past", "image-feature-extraction",
        "latent-consistency", "masked-lm", "pretraining", "seq2seq-lm", "seq2seq-lm-with-past",
        "sequence-classification", "speech2seq-lm", "speech2seq-lm-with-past", "stable-diffusion",
        "stable-diffusion-xl", "summarization", "text-to-speech", "translation", "vision2seq-lm",
        "zero-shot-classification",
    }
)  # fmt: skip
WITH_PAST = "-with-past"


def is_task(name: str) -> bool:
    """Whether optimum knows the task, with or without ``-with-past`` (the manifest's check, for ``convert --task``)."""
    return name in TASKS or name.removesuffix(WITH_PAST) in TASKS


def variant_files(component: str, variant: str) -> tuple[str, ...]:
    """The names one component's graph has in one variant under onnx/, the recorded one first.

    ``variant_files("model", "int8") == ("model_quantized.onnx", "model_int8.onnx")``.
    """
    return tuple(f"{component}{JS_SUFFIXES[dtype]}.onnx" for dtype in JS_DTYPES[variant])


def variant_of(filename: str) -> str | None:
    """The variant a graph file under onnx/ belongs to, from its name (``decoder_model_merged_q4.onnx`` -> q4)."""
    stem = filename.removesuffix(".onnx")
    by_suffix = {JS_SUFFIXES[d]: v for v, dtypes in JS_DTYPES.items() for d in dtypes}
    # Longest suffix first: every name ends with fp32's empty one.
    return next((v for suffix, v in sorted(by_suffix.items(), key=lambda kv: -len(kv[0])) if stem.endswith(suffix)), None)

# Marks the VariantResult fields that are the latency and its conditions (LATENCY_FIELDS): the one
# place they are named. The benchmark's Latency, the DB writer and publishing's reader follow it.
LATENCY = {"latency": True}

PASSED = "passed"
FAILED = "failed"
# A deployment target that could not run a variant: no code for its architecture (unsupported), or not
# run at all on this node (not-run: the target is not installed, or its device is absent).
UNSUPPORTED = "unsupported"
NOT_RUN = "not-run"
TARGET_STATUSES = (PASSED, FAILED, UNSUPPORTED, NOT_RUN)
# The deployment targets zoo_convert.targets registers (a test keeps the two the same): what a manifest's
# ``targets`` column and ``--targets`` may name, checked without importing any runtime.
TARGETS = ("ort-cpu", "openvino", "transformers.js", "ort-cuda", "ort-tensorrt")
# Verified without a failure against a PyTorch reference that cannot tell a right graph
# from a wrong one (constant, all zero or non-finite at every verify input): not a pass.
INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class HubSnapshot:
    """A hub checkpoint as planning resolved it, so the job downloads it without asking the Hub again.

    Attributes:
        sha: the commit the entry's revision pointed at.
        files: every file path in that commit.
    """

    sha: str
    files: tuple[str, ...]


@dataclass(frozen=True)
class ManifestEntry:
    """One conversion job: a checkpoint with the settings it is converted with.

    Attributes:
        source: hub repo id (``org/name``) or a local folder path.
        task: optimum task name; None means infer it from ``config.architectures``.
        revision: hub branch, tag or commit; None means the default branch.
        opset: ONNX opset to export with; None lets the exporter choose.
        exporter: ``optimum`` (main_export), ``torch`` (torch.onnx.export, dynamo) or ``auto``
            (optimum where it has a config for the model type and task, else the torch exporter).
        variants: which artifacts to build and verify.
        timeout_s: hard per-job timeout in the farm; None uses Settings.timeout_s.
        memory_gb: memory the job may use before it counts as ``oom``.
        gpu: run on a GPU node with the CUDA execution provider.
        allow_remote_code: pass ``trust_remote_code=True`` to transformers.
        allow_pickle: accept ``pytorch_model.bin`` (pickle) weights.
        priority: higher runs first.
        tags: free-form labels carried into the DB.
        row: 1-based manifest row this entry came from (None outside a manifest).
        snapshot: for a hub id, the commit and file list planning resolved (None: fetch asks the Hub).
        optimize: the optimization level of this job's fp32 graph (one of OPTIMIZATION_LEVELS);
            None uses ``Settings.optimization``.
        targets: the deployment targets each variant is checked on (``zoo_convert.targets``);
            None uses ``Settings.targets``.
    """

    source: str
    task: str | None = None
    revision: str | None = None
    opset: int | None = None
    exporter: str = "optimum"
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    timeout_s: float | None = None
    memory_gb: float | None = None
    gpu: bool = False
    allow_remote_code: bool = False
    allow_pickle: bool = False
    priority: int = 0
    tags: tuple[str, ...] = ()
    row: int | None = None
    snapshot: HubSnapshot | None = None
    optimize: str | None = None
    targets: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Settings:
    """Farm-wide conversion settings, passed explicitly to every stage.

    Attributes:
        out_dir: where per-model artifact folders are written.
        tolerances: per-variant pass criteria.
        verify_shapes: (batch, sequence) pairs verification runs at; they differ
            from the exporter's dummy input so the dynamic axes are exercised.
        verify_long: also verify at one long shape per component, batch 1 at the length
            the model is used at (``zoo_convert.verify.shapes``); False checks the short shapes only.
        verify_generation: also run a decoder exported with past for 16 greedy steps on ONNX Runtime's own
            cache against PyTorch generate() (``zoo_convert.verify.generation``); False checks single forwards only.
        bench_warmup / bench_runs: per side (PyTorch, then each variant, each in a block of its own),
            untimed calls first (and ``benchmark.WARMUP_S`` of them), then timed samples (each
            ``benchmark.SAMPLE_S`` of back-to-back calls, or one call): at least this many and
            ``benchmark.MIN_TIMED_S`` of them.
        bench_budget_s: seconds of timed calls of one side after which a slow model stops
            early (after ``benchmark.MIN_RUNS`` samples): one big graph should not hold the node's latency phase.
        providers: ONNX Runtime execution providers, in preference order.
        threads: intra-op threads for torch and ORT inside one job.
        timeout_s: default hard timeout per job (farm only).
        hf_endpoint / hf_cache: Hub location and cache; None uses huggingface_hub's defaults.
        offline: never touch the network (HF_HUB_OFFLINE semantics).
        hub_timeout_s: how long one Hub request may wait for an answer (connect and each read).
        external_data_threshold: models above this many bytes store weights as external data.
        optimize: fuse the fp32 graph; False keeps the plain export as the fp32 artifact
            (``--no-optimize``, optimum-cli without ``--optimize``); fp16 and int8 are still made.
        shapes: input shapes fixed by the user (:data:`SHAPE_OPTIONS`): batch_size and sequence_length
            replace those of the short verify shapes and the benchmark's; the others (image size,
            channels, audio samples, mel bins and frames, choices) are fed at every shape.
        optimization: the level the fp32 graph is optimized at when ``optimize`` is on (O1, O2, O3:
            ``--optimize``); a manifest row's ``optimize`` overrides it for its job.
        benchmark: measure latency; False skips the benchmark stage (``--no-benchmark``).
        warm_torch_exporter: the fork server the jobs fork from also warms the torch exporter (one tiny
            dynamo export at its start: :mod:`zoo_convert.farm.warm_torch`); the farm sets it when its plan
            has a ``torch`` row. It decides no artifact's bytes, only how warm the job's process starts.
        targets: the deployment targets every variant is checked on from its saved reference
            (``zoo_convert.targets``: ``ort-cpu``, ``openvino``, ``transformers.js``, ``ort-cuda``,
            ``ort-tensorrt``); None: every target installed on the node; ``()``: none.
    """

    out_dir: str = "artifacts"
    tolerances: dict[str, Tolerance] = field(default_factory=lambda: {n: s.tolerance for n, s in REGISTRY.items()})
    verify_shapes: tuple[tuple[int, int], ...] = ((1, 7), (3, 19))
    verify_long: bool = True
    verify_generation: bool = True
    bench_warmup: int = 1
    bench_runs: int = 20
    bench_budget_s: float = 1.0
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    threads: int = 1
    timeout_s: float = 600.0
    hf_endpoint: str | None = None
    hf_cache: str | None = None
    offline: bool = False
    hub_timeout_s: float = 10.0
    external_data_threshold: int = 2 * 1024**3
    optimize: bool = True
    benchmark: bool = True
    optimization: str = DEFAULT_OPTIMIZATION
    shapes: dict[str, int] = field(default_factory=dict)
    warm_torch_exporter: bool = False
    targets: tuple[str, ...] | None = None


@dataclass(frozen=True)
class StageResult:
    """How one stage went.

    Attributes:
        stage: fetch, export, check, optimize, verify, benchmark.
        status: passed or failed.
        seconds: wall time of the stage.
        peak_mem_mb: peak resident memory of the process at the end of the stage.
        details: stage-specific facts (fusion statistics, files, ...).
    """

    stage: str
    status: str
    seconds: float
    peak_mem_mb: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VariantResult:
    """One ONNX artifact (one of VARIANTS) and how it verified and ran.

    Attributes:
        variant: fp32, fp16, int8, uint8 or q4.
        status: passed, failed or inconclusive (no check failed, but the reference proves nothing;
            ``message`` says why).
        file: path relative to the model's artifact folder (``onnx/model.onnx``); the first of the variant's names
            (int8: ``onnx/model_quantized.onnx``, hard-linked as ``onnx/model_int8.onnx``).
        size_bytes: the .onnx file plus its external data.
        failure_kind / message: why it failed (None when it passed).
        traceback: where it failed, when an exception made it fail (always for ``internal``); for a
            verified variant, where timing it failed when ``bench_note`` is ``internal: ...``.
        max_abs / max_rel / mean_abs / min_cosine: worst values over all outputs and shapes.
        ort_p50_ms / ort_p90_ms: ONNX Runtime latency.
        torch_p50_ms / torch_p90_ms: PyTorch eager latency on the same inputs (timed once per job,
            in a block of its own beside the variants': the same figures on each of the job's rows).
        speedup: torch_p50_ms / ort_p50_ms.
        ort_runs / torch_runs: timed samples behind each latency (each 2.5 ms of back-to-back calls, or one call).
        ort_spread / torch_spread: interquartile range over the median of those calls.
        ort_ci / torch_ci: the width of the median's 95 % confidence interval over the median: how well the
            samples pin the median down (a side is sampled until it is within ``benchmark.NOISY_CI``).
        bench_threads / bench_shape / bench_cpu / bench_load: the conditions of the measurement:
            intra-op threads, batch x length, CPU model, and the CPUs other processes kept busy
            during it (the most over its sides; /proc/stat less the job's own CPU time).
        bench_noisy: a side's median was not pinned down (``ort_ci`` / ``torch_ci`` above
            ``benchmark.NOISY_CI``), or other processes took CPUs the measurement needed: not to
            trust the latency (kept, but left out of the speedup headline, the ``slower`` regressions
            and the model card).
        bench_note: why the latency is empty (timing failed; the variant stays verified).
        optimizer: fusion statistics and whether any fusion applied.
        outputs: per-output verification numbers.
        generation_steps: decoding steps ONNX Runtime ran with its own cache, teacher-forced on PyTorch
            generate()'s greedy tokens, each step's logits checked at the variant's tolerance (their checks are
            among ``outputs``, shape ``1x13/step05``); None for a model that does not generate.
        generation_max_abs / generation_min_cosine: the worst of those steps' logits.
        generation_token_match: share of ONNX Runtime's own greedy tokens (free-running on its cache)
            identical to PyTorch generate()'s (fp32 must reach 1.0; other variants: information).
        generation_note: why a model exported with past had no generation check, or that fp32's greedy
            tokens diverged on a near tie of PyTorch's logits (closer than the tolerance: not a failure).
    """

    variant: str
    status: str
    file: str | None = None
    size_bytes: int | None = None
    failure_kind: str | None = None
    message: str | None = None
    traceback: str | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    mean_abs: float | None = None
    min_cosine: float | None = None
    ort_p50_ms: float | None = field(default=None, metadata=LATENCY)
    ort_p90_ms: float | None = field(default=None, metadata=LATENCY)
    torch_p50_ms: float | None = field(default=None, metadata=LATENCY)
    torch_p90_ms: float | None = field(default=None, metadata=LATENCY)
    speedup: float | None = field(default=None, metadata=LATENCY)
    ort_runs: int | None = field(default=None, metadata=LATENCY)
    ort_spread: float | None = field(default=None, metadata=LATENCY)
    torch_runs: int | None = field(default=None, metadata=LATENCY)
    torch_spread: float | None = field(default=None, metadata=LATENCY)
    ort_ci: float | None = field(default=None, metadata=LATENCY)
    torch_ci: float | None = field(default=None, metadata=LATENCY)
    bench_threads: int | None = field(default=None, metadata=LATENCY)
    bench_shape: str | None = field(default=None, metadata=LATENCY)
    bench_cpu: str | None = field(default=None, metadata=LATENCY)
    bench_load: float | None = field(default=None, metadata=LATENCY)
    bench_noisy: bool | None = field(default=None, metadata=LATENCY)
    bench_note: str | None = field(default=None, metadata=LATENCY)
    optimizer: dict[str, Any] = field(default_factory=dict)
    outputs: tuple[OutputCheck, ...] = ()
    generation_steps: int | None = None
    generation_max_abs: float | None = None
    generation_min_cosine: float | None = None
    generation_token_match: float | None = None
    generation_note: str | None = None


@dataclass(frozen=True)
class TargetResult:
    """One variant checked on one deployment target against the saved reference (never the ORT verdict).

    Attributes:
        target: the target's registered name (``openvino``, ``transformers.js``, ``ort-cuda`` ...).
        version: the runtime's version (``2026.4.1``); None when it is not installed.
        variant: the variant checked.
        status: passed, failed, unsupported (the runtime has no code for the model) or not-run.
        message: the runtime's own error, the worst check, or why it did not run.
        max_abs / min_cosine: the worst over every output and case it ran.
        latency_ms: median of its timed calls of the first case (a short shape, batch 1).
        providers: what really ran it (ONNX Runtime: the session's providers; OpenVINO: the device).
        seconds: wall time of the whole check.
        checks: the cases' output checks.
        graph: the graph files it ran, relative to the artifact folder (``onnx/standard/model.onnx``
            where the target reads standard ONNX ops and the variant ships fused), comma-separated.
    """

    target: str
    variant: str
    status: str
    version: str | None = None
    message: str | None = None
    max_abs: float | None = None
    min_cosine: float | None = None
    latency_ms: float | None = None
    providers: str | None = None
    seconds: float | None = None
    checks: tuple[OutputCheck, ...] = ()
    graph: str | None = None


# The latency columns of a variant, in VariantResult's order (results columns of the same names).
LATENCY_FIELDS = tuple(f.name for f in dataclasses.fields(VariantResult) if f.metadata.get("latency"))


@dataclass(frozen=True)
class ConversionResult:
    """Everything the farm records about one job.

    Attributes:
        source / revision / task / exporter / opset_requested: the job as asked.
        resolved_revision: hub commit sha or ``sha256:`` content hash of a local folder.
        model_type / library: from the checkpoint's config.
        exporter_used / exporter_reason: the exporter that wrote the graphs (``optimum`` or ``torch``;
            exporter ``auto`` resolves to one), and why the torch exporter's generic path was taken
            (optimum has no config for the model type and task); None before an export.
        status: passed when the fp32 artifact (or, without fp32, every variant) verified;
            inconclusive when it is inconclusive (see VariantResult), failed otherwise.
        failure_kind / stage / message / traceback: the first failure, if any (an inconclusive
            job has only the message, saying why).
        opset / ir_version / node_count / op_census: facts of the exported fp32 graph.
        stages: per-stage timings and details.
        variants: per-artifact results.
        artifacts_dir: folder holding ``onnx/`` and the copied config files.
        versions: toolchain versions the job ran with.
        started_at / finished_at: ISO-8601 UTC timestamps.
        paused: the windows (epoch seconds) a farm stopped the job in while its node's latency phase timed
            others (farm.driver._NodeLeases); its stages' seconds leave them out.
        attempts: how many times the farm ran this job (1 outside the farm).
        timeout_s: the hard timeout the job ran under (farm jobs; None outside the farm).
        node: host that ran the job.
        row: manifest row number, when it came from a manifest.
        tags: the entry's tags.
        targets: each variant on each deployment target (``zoo_convert.targets``), from the saved reference.
    """

    source: str
    status: str
    task: str | None = None
    revision: str | None = None
    resolved_revision: str | None = None
    exporter: str = "optimum"
    opset_requested: int | None = None
    model_type: str | None = None
    library: str | None = None
    exporter_used: str | None = None
    exporter_reason: str | None = None
    failure_kind: str | None = None
    stage: str | None = None
    message: str | None = None
    traceback: str | None = None
    opset: int | None = None
    ir_version: int | None = None
    node_count: int | None = None
    op_census: dict[str, int] = field(default_factory=dict)
    stages: tuple[StageResult, ...] = ()
    variants: tuple[VariantResult, ...] = ()
    artifacts_dir: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    started_at: str | None = None
    finished_at: str | None = None
    paused: tuple[tuple[float, float], ...] = ()
    attempts: int = 1
    timeout_s: float | None = None
    node: str | None = None
    row: int | None = None
    tags: tuple[str, ...] = ()
    targets: tuple[TargetResult, ...] = ()

    @property
    def passed(self) -> bool:
        """Converted: the fp32 artifact verified."""
        return self.status == PASSED

    @property
    def partial(self) -> bool:
        """Converted, while another variant (fp16, int8, ...) failed."""
        return self.passed and any(v.status != PASSED for v in self.variants)

    def variant(self, name: str) -> VariantResult | None:
        return next((v for v in self.variants if v.variant == name), None)

    def failed_stage(self, v: VariantResult) -> str:
        """The stage a failed variant failed in: its own failed stage, else the one its failure kind names."""
        for s in self.stages:
            if s.details.get("variant") == v.variant and s.status == FAILED:
                return s.stage
        try:
            return FailureKind(v.failure_kind).stage
        except ValueError:
            return "verify"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=_json_default, allow_nan=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConversionResult:
        d = dict(d)
        d["stages"] = tuple(StageResult(**s) for s in d.get("stages", ()))
        d["variants"] = tuple(
            VariantResult(**{**v, "outputs": tuple(OutputCheck(**o) for o in v.get("outputs", ()))})
            for v in d.get("variants", ())
        )
        d["tags"] = tuple(d.get("tags", ()))
        d["paused"] = tuple((float(a), float(b)) for a, b in d.get("paused", ()))
        d["targets"] = tuple(
            TargetResult(**{**t, "checks": tuple(OutputCheck(**o) for o in t.get("checks", ()))})
            for t in d.get("targets", ())
        )
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> ConversionResult:
        return cls.from_dict(json.loads(text))


def _json_default(o: Any) -> Any:
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    return str(o)

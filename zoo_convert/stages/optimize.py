"""The optimize stage: fp32 optimized, fp16, int8, uint8 and q4 variants of every exported graph.

Per component (1 and 2 from the plain export, side by side where the job has the threads; 3 begun from each of
2's candidates while that candidate is checked, kept with the one 2 keeps; 4 last):

1. int8  dynamic quantization of the PLAIN export (a fused graph has no MatMuls left to
         quantize; :mod:`zoo_convert.variants.int8`), streamed one weight at a time by :mod:`zoo_convert.variants.quantize` (ORT's
         ``quantize_dynamic`` holds the model about three times): every MatMul, Gemm and Conv
         with a constant float32 weight, int8 per output channel; the embedding lookups and
         Convs whose weight is computed (weight norm: wav2vec2's positional conv) stay float32.
         uint8 is the same with unsigned weights.
   q4    4-bit block-wise weight-only quantization of the plain export's MatMuls
         (``MatMulNBits``), as transformers.js's ``q4``: :mod:`zoo_convert.variants.q4`.
         Every variant made from the plain export is made by its maker (``VariantSpec.maker``).
2. fp32  at the level asked (``Settings.optimization``, optimum-cli's ``--optimize``; levels as
         optimum's ``AutoOptimizationConfig`` maps them): O1 is ONNX Runtime's basic graph
         optimizations alone (ORT_ENABLE_BASIC, no fuser); O2, the default, is what follows;
         O3 is O2 with the fuser's GELU approximation (FastGelu), kept only when it still
         matches PyTorch within the fp32 tolerance. (O4, O3 in fp16, is the fp16 variant.)
         The first candidate that loads, runs and matches PyTorch (verify's own checks):
         the onnxruntime transformers optimizer where the model type maps to one of its
         fusers (its Python fusions, without ORT's symbolic shape inference, after ORT's
         basic optimizations where a fuser needs them: :data:`FUSION_OPT_LEVEL`), never on a
         merged decoder (its fusions match nothing in the If branches); else, or
         when it fused nothing, failed, or its graph did not run or match, ONNX Runtime's
         offline graph optimization (ORT_ENABLE_EXTENDED: ALL writes hardware-specific
         layouts); else the plain export, unchanged. A fused graph is never kept unless it
         ran and matched. With ``Settings.optimize`` off (``--no-optimize``) the plain export.
3. fp16  the chosen fp32 graph converted with float32 inputs and outputs kept, and
         integer index arithmetic (T5's position buckets) left in fp32 (:mod:`zoo_convert.variants.fp16`),
         typed by ONNX's shape inference on the graph without its weights (no symbolic shape
         inference); where ORT's converter cannot convert it (ORT-optimized If branches: merged
         decoders), or with ``--no-optimize``, the plain export converted the same way.
4. the fp32 graph replaces ``<component>.onnx``.

Each variant of each component is made in a short-lived forked child
(:mod:`zoo_convert.stages.forked`) that writes it under its final name in a scratch folder,
opens it in ONNX Runtime (one session) and, when the job's PyTorch references are
computed (``verify.references``), runs verify's checks on it
(``Artifact.verified``): its transient copies, its session and any ONNX Runtime
crash go with the child. The job's process holds one weightless graph per component.
fp32's candidates are each made in one child and checked in another, and fp16 is begun from
a candidate while it is checked (kept when fp32 keeps that candidate). A job runs as many
children at once as it has threads (:func:`_lanes`): a farm job one, ``convert`` on a machine
of its own its CPUs (int8 beside fp32, fp16 beside fp32's check; a child begun once another is done checks on
every thread of the job). Components go one after the
other: a decoder's generation check reads the encoder's variant where it ships (its encoding of the prompt, which
the encoder's own check made: ``RuntimeCache.encoded``); where a component's
children leave a CPU idle (fp32 alone on 2), the next one's first fp32 candidate is made meanwhile (it
needs nothing of the one before: whisper-tiny's decoder, 0.25 s of a 2.9 s stage at real size).

The export keeps every graph's weights in ``<file>_data`` beside it for the whole job;
the variants are written the way loaders expect them: weights inside the graph
unless the model is over ``Settings.external_data_threshold``, then in one
``<file>_data`` named for its final file, so placing it is a rename.
Each variant's graph is written under its transformers.js name and hard-linked under the
other names the same graph answers to (int8: ``model_quantized.onnx`` = ``model_int8.onnx``;
:data:`~zoo_convert.records.JS_DTYPES`), so a second name costs no disk.

A variant that cannot be made is returned with ``details["error"]`` and no files;
only fp32, which the others are measured against, raises :class:`OptimizeError`.
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx

from .. import node, onnx_graph
from ..errors import (
    FailureKind,
    ForkedError,
    OptimizeError,
    VerifyError,
    first_line,
    is_our_bug,
    storage_fault,
)
from ..records import STANDARD_FOLDER, Settings, variant_files
from ..variants import REGISTRY, fp16, maker
from ..variants.quantize import unsigned_twin
from ..verify import generation
from ..verify.runtime import ort_session, session_for
from . import Artifact, Check, Component, ExportedModel, Verified
from .forked import run_forked, step

# HF model_type -> onnxruntime.transformers.optimizer MODEL_TYPES key. Follows optimum's
# ORTConfigManager, limited to fusers ORT ships; unlisted types get ORT offline optimization.
FUSION_TYPES = {
    "albert": "bert",
    "bart": "bart",
    "bert": "bert",
    "camembert": "bert",
    "clip": "clip",
    # a diffusers pipeline's text encoders (the unet and vae fusers emit CUDA-only NhwcConv and GroupNorm:
    # those components get ORT offline optimization on CPU)
    "clip-text": "clip",
    "clip-text-with-projection": "clip",
    "deberta": "bert",
    "deberta-v2": "bert",
    "dinov2": "vit",
    "distilbert": "bert",
    "electra": "bert",
    "gpt2": "gpt2",
    "gpt_neo": "gpt2",
    "gpt_neox": "gpt2",
    "gptj": "gpt2",
    "marian": "bart",
    "mbart": "bart",
    "modernbert": "bert",
    "mpnet": "bert",
    "roberta": "bert",
    "swin": "swin",
    "t5": "bert",  # the t5 fuser emits RelativePositionBias, which has no CPU kernel
    "vit": "vit",
    "whisper": "bart",
    "xlm-roberta": "bert",
}
# The ORT optimization level each fuser runs after: the lowest at which its fusions, without
# symbolic shape inference, match what level 0 with it fused (fused op counts over the zoo,
# bert-base and gpt2: benchmarks/REALSIZE_NOTES.md, proposal 2). The bert fuser needs ORT's basic
# constant folding to see Attention and EmbedLayerNormalization's shapes; the others fuse as
# much at level 0 (bart's one more SkipLayerNormalization). Without shape inference the t5
# encoder loses SkipSimplifiedLayerNormalization (3 in the zoo's) and gpt-neox RotaryEmbedding:
# ONNX Runtime's own level-2 fusions make them when it loads the graph.
FUSION_OPT_LEVEL = {"bert": 1}
# Contrib ops the fusers emit; fusion applied when the optimized graph has more of them.
_FUSED_OPS = (
    "Attention",
    "MultiHeadAttention",
    "GroupQueryAttention",
    "EmbedLayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "SimplifiedLayerNormalization",
    "LayerNormalization",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "QuickGelu",
    "GemmFastGelu",
    "BiasAdd",
    "BiasSplitGelu",
    "RotaryEmbedding",
    "FusedMatMul",
    "FusedConv",
    "FusedGemm",
    "MatMulNBits",
)
ORT = "ONNX Runtime"
# The variants that get a graph of standard ONNX ops beside them when theirs holds contrib ops: the ones
# ONNX Runtime's fusions touch (int8, uint8 and q4 are made from the plain export).
STANDARD_VARIANTS = ("fp32", "fp16")


def variant_file(component: str, variant: str) -> str:
    """File name of one component's graph in one variant (``encoder_model_fp16.onnx``)."""
    return variant_files(component, variant)[0]


@dataclass
class _Made:
    """One variant of one component as its child made it: the graph (None when it could not be made) and how.

    ``details`` holds ``error`` and ``failure_kind`` (and ``traceback`` for a bug of ours) when
    it could not be made; ``verified`` is verify's ONNX Runtime side, None without references.
    """

    path: Path | None
    details: dict[str, Any] = field(default_factory=dict)
    verified: Verified | None = None
    standard: Path | None = None


@dataclass
class _Early:
    """One component's first fp32 candidate as :func:`_ahead`'s child made it: what it returned or raised, its seconds."""

    method: str
    outcome: _Candidate | BaseException
    seconds: float

    def result(self) -> _Candidate:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def _ahead(exported: ExportedModel, component: Component, settings: Settings, scratch: Path) -> _Early | None:
    """In a thread: the component's first fp32 candidate, made in a child while the component before it is optimized
    (where ``_component`` would make it: ``scratch/<component>/fp32/<method>/``); None when it has no candidate."""
    _, _, candidates = _fp32_plan(exported, component, _external(component.path, settings), settings)
    if not candidates:
        return None
    method, _, build = candidates[0]
    out = scratch / component.name / "fp32" / method / component.path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        outcome: _Candidate | BaseException = run_forked(functools.partial(build, out), timeout_s=settings.timeout_s)
    except Exception as exc:  # noqa: BLE001 - raised where _fp32 takes it, as its own child's would be
        outcome = exc
    return _Early(method, outcome, time.perf_counter() - t0)


def _ahead_of(
    components: list[Component], at: int, variants: tuple[str, ...], settings: Settings, lanes: int
) -> Component | None:
    """The component whose first fp32 candidate is made while ``components[at]`` is optimized: the next one, where the
    job has a CPU that component's children leave idle (an fp32-only job on 2 CPUs: one child at a time) and neither
    graph is one a child holds alone (over the external-data threshold)."""
    if at + 1 >= len(components) or lanes >= settings.threads or "fp32" not in _first(variants):
        return None
    if _alone(components[at].path, settings) or _alone(components[at + 1].path, settings):
        return None
    return components[at + 1]


def optimize(
    exported: ExportedModel,
    variants: tuple[str, ...],
    settings: Settings,
    *,
    check: Check | None = None,
    standard: bool = False,
) -> dict[str, Artifact]:
    """Build the requested variants of every component; fp32 failing raises, the others fail as data.

    ``standard``: beside a variant whose graph holds ONNX Runtime's contrib ops, make its graph of standard
    ONNX ops too (``onnx/standard/``); the pipeline asks for it only when a chosen target reads them (openvino):
    at real size it is a second copy of the fp32 and fp16 weights.

    ``check`` (verify's ONNX Runtime side, ``verify.check``: no stage imports another) runs on
    each graph in the child that made it once the job's PyTorch references are computed;
    without it, or before them, each graph is only loaded in ONNX Runtime.

    Where a component's children leave a CPU idle, the next component's first fp32 candidate is made meanwhile
    (:func:`_ahead_of`): whisper-tiny's decoder graph, made while the encoder's is fused and checked.
    """
    artifacts = {v: Artifact(variant=v, files={}, details={"components": {}}) for v in variants}
    # Scratch on the artifacts' file system, so placing a variant is a rename.
    with tempfile.TemporaryDirectory(dir=exported.out_dir, prefix=".optimize-") as folder, \
            ThreadPoolExecutor(1, "ahead") as ahead:  # fmt: skip
        scratch = Path(folder)
        components = list(exported.components)
        early: Future[_Early | None] | None = None  # this component's first fp32 candidate, made ahead
        # One component after the other: a decoder's generation check encodes its prompt with the encoder's
        # variant where it ships (verify.generation), or takes that encoding from the encoder's own check.
        for at, component in enumerate(components):
            lanes = _lanes(settings, _alone(component.path, settings), len(_first(variants)) + ("fp16" in variants))
            lane = replace(settings, threads=max(1, settings.threads // lanes))  # each child's share of the threads
            made_ahead = early.result() if early is not None else None
            following = _ahead_of(components, at, variants, settings, lanes)
            early = ahead.submit(_ahead, exported, following, settings, scratch) if following is not None else None
            with ThreadPoolExecutor(lanes, "variant") as pool:  # the children, ``lanes`` at once
                made = _component(exported, component, variants, settings, lane, scratch, check, standard, pool,
                                  made_ahead)  # fmt: skip
            _place(component, made, variants, settings)
            for variant, part in made.items():
                if part.verified is not None and part.verified.encoded is not None:
                    if part.path is not None:  # the encoder as it ships (placed): its decoder's children read it there
                        exported.cache.encoded[part.path] = part.verified.encoded
                    part.verified = replace(part.verified, encoded=None)
                part.details["children_at_once"] = lanes  # its seconds ran beside the others' when more than one
                art = artifacts[variant]
                art.details["components"][component.name] = part.details
                if part.verified is not None:
                    art.verified[component.name] = part.verified
                if part.path is None:
                    found = part.details.pop("traceback", None)  # kept on the artifact, not in the recorded details
                    art.traceback = art.traceback or found
                    art.details.setdefault("failure_kind", part.details["failure_kind"])
                    art.details.setdefault("error", f"{variant} of {component.name}: {part.details['error']}")
                else:
                    art.files[component.name] = part.path
                    if part.standard is not None:
                        art.standard[component.name] = part.standard
    for art in artifacts.values():
        if "error" in art.details:
            _discard(art)
        _summarize(art)
        stems = {c.name: c.path.stem for c in exported.components}
        for name, path in art.files.items():
            for alias in variant_files(stems[name], art.variant)[1:]:
                onnx_graph.link(path, path.with_name(alias))
    return artifacts


def _discard(art: Artifact) -> None:
    """Remove a failed variant's other components: half a variant would only mislead a loader."""
    for path in (*art.files.values(), *art.standard.values()):
        onnx_graph.delete(path)
    art.files.clear()
    art.standard.clear()


def _component(
    exported: ExportedModel,
    component: Component,
    variants: tuple[str, ...],
    settings: Settings,
    lane: Settings,
    scratch: Path,
    check: Check | None,
    standard: bool,
    pool: ThreadPoolExecutor,
    early: _Early | None = None,
) -> dict[str, _Made]:
    """All variants of one graph, each made in its own child in ``pool`` (on ``lane``'s threads), in scratch.

    fp32 and the variants made from the plain export start at once; fp16 from each fp32 candidate as soon as
    it is made (checked meanwhile), kept when that candidate is the one fp32 keeps.
    """
    plain = component.path
    external = _external(plain, settings)
    final = _finals(component, variants)
    work = {v: scratch / component.name / v for v in (*variants, "fp32", *(f"{v}-standard" for v in STANDARD_VARIANTS))}
    for folder in work.values():
        folder.mkdir(parents=True, exist_ok=True)
    fp16s: dict[Path, Future[_Made]] = {}  # fp16 by the fp32 candidate it was made from

    def fp16_from(source: Path, method: str) -> None:
        # A merged decoder's fp16 reads the plain export, never the candidate fp32's check rewrites in place.
        if "fp16" in variants:
            out = work["fp16"] / method / final["fp16"].name
            out.parent.mkdir(exist_ok=True)
            fp16s[source] = pool.submit(trailing.run, functools.partial(
                _fp16_of, exported, component, source, method, out, external, check=check))  # fmt: skip

    trailing = _Trailing(lane, settings)
    started: dict[str, Future[_Made]] = {}
    for variant in _first(variants):  # fp32 first: the longest way, through fp16
        if variant == "fp32":
            started[variant] = pool.submit(trailing.run, lambda threads: _fp32(
                exported, component, work["fp32"], external, threads, check, fp16_from, early))  # fmt: skip
        else:
            spec = REGISTRY[variant]
            quantize = functools.partial(maker(spec), plain, work[variant] / final[variant].name, external, **spec.options)
            make = functools.partial(_checked, exported, component, variant, quantize)
            started[variant] = pool.submit(trailing.run, functools.partial(_made_on, variant, make, check, settings))
    made: dict[str, _Made] = {}
    if "fp32" in started:
        try:
            fp32 = started.pop("fp32").result()
        except Exception as exc:  # noqa: BLE001 - re-raised as this variant's error
            if storage_fault(exc) is not None or is_our_bug(exc) or _internal(exc):
                raise
            raise OptimizeError(f"fp32 of {component.name}: {first_line(exc)}") from exc
        if "fp32" in variants:
            made["fp32"] = fp32
        if "fp16" in variants:
            assert fp32.path is not None  # _fp32 always keeps a graph, the plain export at worst
            for source, job in fp16s.items():
                if source != fp32.path:
                    job.cancel()  # made from a candidate fp32 did not keep: not begun, never begins
            started["fp16"] = fp16s[fp32.path]
    for variant, job in started.items():
        made[variant] = job.result()

    standards = {
        variant: pool.submit(_guarded, variant, functools.partial(
            _standard, exported, component, variant, work[f"{variant}-standard"] / final[variant].name, external, lane, check
        ), settings)
        for variant in (STANDARD_VARIANTS if standard else ())  # beside a graph with contrib ops, one of standard ops
        if variant in made and made[variant].path is not None and made[variant].details.get("contrib_ops")
    }  # fmt: skip
    for variant, job in standards.items():
        _add_standard(made[variant], job.result(), settings)
    return made


class _Trailing:
    """Which threads a variant's child of one graph gets: its lane's share, or every thread of the job where it starts
    after another of the graph's children is done.

    On 2 CPUs three children share two lanes: the third (fp16, begun once int8 is done) checked on one thread ran on
    with the other CPU idle once fp32's check was done (whisper-tiny: 4-5 s of each graph's). On every thread it
    shares the CPUs with the one still running for a while, then has them both.
    """

    def __init__(self, lane: Settings, job: Settings) -> None:
        self._lane, self._job = lane, job
        self._lock = threading.Lock()
        self._done = 0

    def run(self, make: Callable[[Settings], _Made]) -> _Made:
        with self._lock:
            settings = self._job if self._done else self._lane
        try:
            made = make(settings)
        finally:
            with self._lock:
                self._done += 1
        made.details.setdefault("threads", settings.threads)
        return made


def _made_on(
    variant: str, make: Callable[[Settings, Check | None], _Made], check: Check | None, job: Settings, threads: Settings
) -> _Made:
    """:func:`_guarded` of a variant whose child runs on ``threads`` (:class:`_Trailing`), with the job's timeout."""
    return _guarded(variant, functools.partial(make, threads, check), job)


def _first(variants: tuple[str, ...]) -> list[str]:
    """The variants made from the plain export (fp32, when it or fp16 is asked, and each with a maker)."""
    found = [v for v in ("fp32",) if "fp32" in variants or "fp16" in variants]
    return found + [spec.name for spec in REGISTRY.values() if spec.maker is not None and spec.name in variants]


def _alone(plain: Path, settings: Settings) -> bool:
    """Whether the plain export ships as it is (a big model's, or one without a data file), and so may be rewritten in
    place by a child (a merged decoder's branch outputs) that others would read meanwhile; and a big graph is one
    each child would hold a copy of."""
    return _external(plain, settings) or not onnx_graph.data_path(plain).exists()


def _external(plain: Path, settings: Settings) -> bool:
    """Whether the component's variants ship with their weights in a data file: a graph over the threshold."""
    return onnx_graph.disk_size(plain) > settings.external_data_threshold


def _finals(component: Component, variants: tuple[str, ...]) -> dict[str, Path]:
    """Where each variant of the component ships: a pipeline's ``unet/model_fp16.onnx``."""
    plain = component.path
    return {v: plain.with_name(variant_file(plain.stem, v)) for v in variants}


def _place(component: Component, made: dict[str, _Made], variants: tuple[str, ...], settings: Settings) -> None:
    """Move the made variants into ``onnx/``: the fp32 file replaces the plain export every other variant read, last."""
    plain = component.path
    final = _finals(component, variants)
    for variant in variants:
        part = made[variant]
        if part.standard is not None:  # first: it may be the plain export itself (a big model's fp32)
            (plain.parent / STANDARD_FOLDER).mkdir(exist_ok=True)
            part.standard = onnx_graph.move(part.standard, plain.parent / STANDARD_FOLDER / final[variant].name)
    for variant in variants:
        part = made[variant]
        if part.path is not None:
            part.path = onnx_graph.move(part.path, final[variant])
    if "fp32" not in variants and onnx_graph.data_path(plain).exists() and not _alone(plain, settings):
        # No fp32 replaces the plain export: it goes back to the layout loaders expect.
        run_forked(lambda: onnx_graph.internalize(plain), timeout_s=settings.timeout_s)


def _standard(
    exported: ExportedModel, component: Component, variant: str, out: Path, external: bool, settings: Settings,
    check: Check | None,
) -> _Made:
    """In the child: the variant made from the plain export without ONNX Runtime's fusions: standard ONNX ops only.

    fp32 is the plain export itself, fp16 its float16 conversion (as a merged decoder's always is);
    checked against PyTorch on ONNX Runtime like the shipped graph.
    """
    t0 = time.perf_counter()
    plain = component.path
    if variant == "fp32":
        path = _as_final(plain, out, external)
    else:
        _save_fp16(plain, out, external)
        path = out
    contrib = _contrib(path)
    if contrib:
        raise OptimizeError(f"the plain export has ops outside ONNX's standard domains: {_ops(contrib)}")
    return _timed(_Made(path, {"source": "plain export"}, _verified(exported, component, variant, path, settings, check)), t0)


def _add_standard(part: _Made, standard: _Made, settings: Settings) -> None:
    """Keep the standard graph beside the variant's when it could be made and matches PyTorch; say why not otherwise."""
    found = standard.verified
    if standard.path is not None and (found is None or found.passed):
        part.standard = standard.path
        part.details["standard"] = {**standard.details, "file": f"{STANDARD_FOLDER}/{standard.path.name}"}
        return
    if standard.path is not None:
        onnx_graph.delete(standard.path)
    why = standard.details.get("error") or (_mismatch(found, settings) if found is not None else "not made")
    part.details["standard"] = {"error": why}


def _contrib_details(path: Path) -> dict[str, dict[str, int]]:
    """``contrib_ops`` for a variant's details, where its graph has any: a standard graph is then written beside it."""
    found = _contrib(path)
    return {"contrib_ops": found} if found else {}


def _contrib(path: Path) -> dict[str, int]:
    """Ops of a written graph outside ONNX's standard domains (ONNX Runtime's fusions), by ``domain.op_type``."""
    return dict(sorted(onnx_graph.contrib_ops(onnx_graph.structure(path).graph).items()))


def _contrib_details_of(graph: onnx.GraphProto) -> dict[str, dict[str, int]]:
    """:func:`_contrib_details` of a graph in memory."""
    found = dict(sorted(onnx_graph.contrib_ops(graph).items()))
    return {"contrib_ops": found} if found else {}


def _ops(census: dict[str, int]) -> str:
    return ", ".join(f"{op} {n}" for op, n in census.items())


def _guarded(variant: str, make: Callable[[], _Made], settings: Settings) -> _Made:
    """Make one variant in a forked child; its failure becomes data instead of failing the model."""
    t0 = time.perf_counter()
    try:
        part = run_forked(make, timeout_s=settings.timeout_s)
    except Exception as exc:  # noqa: BLE001 - a variant that cannot be made is recorded, not raised
        if storage_fault(exc) is not None:
            raise  # a full disk is no fault of this variant: the whole job is redone
        internal = is_our_bug(exc) or _internal(exc)
        kind = FailureKind.INTERNAL if internal else FailureKind.OPTIMIZE_ERROR
        part = _Made(None, {"error": first_line(exc), "failure_kind": kind.value})
        if internal:
            part.details["traceback"] = exc.traceback_text if isinstance(exc, ForkedError) else traceback.format_exc()
    part.details.setdefault("seconds", round(time.perf_counter() - t0, 3))
    return part


def _lanes(settings: Settings, alone: bool, jobs: int) -> int:
    """How many variant children of one graph run at once: one per thread the job was given, at most one per variant.

    A farm job has one thread (the farm packs one job per CPU): one child at a time. ``convert`` on a machine of
    its own has its CPUs, as optimum-cli uses them: on 2 CPUs int8 is made beside fp32, fp16 beside fp32's check
    (each child is mostly one Python thread converting a graph; its ONNX Runtime session gets its share of the
    threads, or all of them where it starts once another child of the graph is done: :class:`_Trailing`). ``alone``:
    one child at a time (a graph over the external-data threshold, which each child would hold a copy of, is one).
    """
    return 1 if alone else max(1, min(settings.threads, jobs))


def _fp16_of(
    exported: ExportedModel, component: Component, source: Path, method: str, out: Path, external: bool,
    settings: Settings, *, check: Check | None,
) -> _Made:
    """In a child: fp16 of the fp32 graph ``source`` (made by ``method``); where the child died on it, the plain export's,
    in a child of its own."""
    made = _guarded("fp16", lambda: _fp16(exported, component, source, method, out, external, settings, check), settings)
    if made.path is None and method != "none" and made.details["failure_kind"] != FailureKind.INTERNAL:
        # The child died on the fp16 of the optimized graph (ONNX Runtime crashed loading it: a
        # signal, which _fp16's own retry cannot catch): the plain export's, in a child of its own.
        first = made.details["error"]
        plain = component.path
        made = _guarded("fp16", lambda: _fp16(exported, component, plain, "none", out, external, settings, check), settings)
        made.details["note"] = f"from the fp32 graph failed: {first}"
    return made


def _internal(exc: BaseException) -> bool:
    """A child's exception that was a bug of ours there."""
    return isinstance(exc, ForkedError) and exc.kind is FailureKind.INTERNAL


def _checked(
    exported: ExportedModel,
    component: Component,
    variant: str,
    make: Callable[[], tuple[Path, dict[str, Any]]],
    settings: Settings,
    check: Check | None,
) -> _Made:
    """In the child: the graph ``make`` writes, opened in ONNX Runtime and checked against PyTorch when possible.

    int8 weights on a CPU whose ONNX Runtime saturates their products are checked on the graph's uint8 twin:
    the verdict is the graph's, the same on every node (:func:`zoo_convert.variants.quantize.unsigned_twin`).
    """
    path, details = make()
    twin = details.get("weight_type") == "QInt8" and node.int8_saturates()
    verified = _verified(exported, component, variant, path, settings, check, twin=twin)
    if twin and verified is not None:
        details = {**details, "verified_on": INT8_TWIN_NOTE}
    return _Made(path, {**details, **_contrib_details(path)}, verified)


# Said in an int8 variant's details where this node checked its twin (targets.SATURATES where a target ran the graph).
INT8_TWIN_NOTE = (
    "its uint8 twin (this CPU, x86 without VNNI or AMX, saturates int8 products in ONNX Runtime: "
    "the twin computes the exact sums VNNI, AMX and ARM CPUs do; on such a CPU deploy uint8)"
)


def _verified(
    exported: ExportedModel,
    component: Component,
    variant: str,
    path: Path,
    settings: Settings,
    check: Check | None,
    *,
    twin: bool = False,
) -> Verified | None:
    """verify's checks of one graph, in one session; just the session without references.

    A graph ONNX Runtime cannot load is an OptimizeError (the variant cannot be made); one it
    loads but cannot run at some input is a Verified with that error. ``twin``: the checks run on
    the graph's uint8 twin, written beside it in a folder of its own (never placed).
    """
    if _merged(component):
        step("onnx", f"making {path.name}'s branch outputs portable")
        onnx_graph.portable_branches(path)
    step(ORT, f"loading {path.name}")
    files = {component.name: path}
    if twin and check is not None and exported.cache.references_done:
        try:
            ort_session(path, threads=1)  # the graph itself must load: the twin answers for its numbers only
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            raise OptimizeError(f"{ORT} cannot load {path.name}: {_last_line(exc)}") from exc
        files = {component.name: _twin(path)}
        # Generation encodes its prompt with the encoder placed before, unless that encoder's check (on its twin)
        # encoded it already.
        if component is generation.decoder(exported):
            for other in exported.components:
                placed = exported.out_dir / "onnx" / variant_files(other.name, variant)[0]
                if other is not component and placed.exists() and placed not in exported.cache.encoded:
                    files[other.name] = _twin(placed, path.parent / "uint8-twin" / other.name)
        step(ORT, f"loading {path.name}'s uint8 twin")
    if check is None or not exported.cache.references_done:
        try:
            ort_session(path, threads=1)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            raise OptimizeError(f"{ORT} cannot load {path.name}: {_last_line(exc)}") from exc
        return None
    artifact = Artifact(variant=variant, files=files)
    inherited = set(exported.cache.sessions)  # the parent's: never destroyed in a child (forked.py)
    try:
        session_for(exported, artifact, component, settings)
    except VerifyError as exc:
        raise OptimizeError(f"{ORT} cannot load {path.name}: {_last_line(exc.__cause__ or exc)}") from exc
    step(ORT, f"running {path.name}")
    t0 = time.perf_counter()
    try:
        return check(exported, artifact, component, settings)
    except Exception as exc:  # noqa: BLE001 - the variant failed verify: data for the record
        kind = exc.kind if isinstance(exc, VerifyError) else FailureKind.INTERNAL if is_our_bug(exc) else None
        if kind is None:
            raise
        tb = "".join(traceback.format_exception(exc)) if kind is FailureKind.INTERNAL else None
        return Verified((), round(time.perf_counter() - t0, 4), first_line(exc), kind.value, tb)
    finally:
        for key in set(exported.cache.sessions) - inherited:  # the one session of this graph, closed once checked
            del exported.cache.sessions[key]


def _twin(path: Path, folder: Path | None = None) -> Path:
    """The graph's uint8 twin, written in ``folder`` (``uint8-twin`` beside it): never placed, never published."""
    step("onnx", f"writing {path.name}'s uint8 twin")
    twinned = (folder or path.parent / "uint8-twin") / path.name
    twinned.parent.mkdir(parents=True, exist_ok=True)
    unsigned_twin(path, twinned)
    return twinned


def _last_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else type(exc).__name__


def _fp32(
    exported: ExportedModel, component: Component, work: Path, external: bool, settings: Settings, check: Check | None,
    made_one: Callable[[Path, str], None], early: _Early | None = None,
) -> _Made:
    """The first candidate that loads, runs and matches PyTorch: fusion, ORT offline, the plain export.

    Run in the job's process: each candidate is made in one forked child (under ``work/<method>/``) and checked in
    another, and ``made_one(path, method)`` is told of it in between, so fp16 can be made from it while it is
    checked (a candidate that fails its check is one fp16 made for nothing). A child that dies making or checking
    a candidate fails that candidate only. ``early``: the first candidate, made ahead (:func:`_ahead`).
    """
    plain = component.path
    t0 = time.perf_counter() - (early.seconds if early is not None else 0.0)

    def checked(path: Path) -> Verified | None:
        return run_forked(lambda: _verified(exported, component, "fp32", path, settings, check), timeout_s=settings.timeout_s)

    def as_plain() -> Path:
        if _ships_as_is(plain, external):
            return plain  # no child to fork for nothing
        (work / "none").mkdir(exist_ok=True)
        return run_forked(lambda: _as_final(plain, work / "none" / plain.name, external), timeout_s=settings.timeout_s)

    details, notes, candidates = _fp32_plan(exported, component, external, settings)
    if not candidates:
        path = as_plain()
        made_one(path, "none")
        return _timed(_Made(path, {**details, **_note(notes)}, checked(path)), t0)
    before = onnx_graph.op_census(component.graph.graph)
    details["checked_against_pytorch"] = check is not None and exported.cache.references_done
    if early is not None:
        details["made_ahead"] = early.method  # in a child beside the previous component's (its seconds included)
    for method, label, build in candidates:
        out = work / method / plain.name
        out.parent.mkdir(exist_ok=True)
        try:
            if early is not None and method == early.method:
                path, census, extra = early.result()
            else:
                path, census, extra = run_forked(functools.partial(build, out), timeout_s=settings.timeout_s)
        except Exception as exc:  # noqa: BLE001 - a broken optimizer falls back to the next candidate
            if is_our_bug(exc) or _internal(exc) or storage_fault(exc) is not None:
                raise
            notes.append(f"{label} failed: {first_line(exc)}")
            continue
        gained = _gained(before, census)
        if method == "transformers_optimizer" and not gained:
            notes.append(f"{label} fused nothing")
            continue
        made_one(path, method)
        try:
            verified = checked(path)
        except OptimizeError as exc:  # it did not load, or its child died checking it
            if _internal(exc):
                raise
            notes.append(f"{label}: {exc.message}")
            continue
        if verified is None or verified.passed:
            kept = {"method": method, "fusion_applied": method == "transformers_optimizer", "fused_ops": gained}
            return _timed(_Made(path, {**details, **extra, **kept, **_note(notes)}, verified), t0)
        notes.append(f"{label}: {_mismatch(verified, settings)}")
    path = as_plain()
    made_one(path, "none")
    return _timed(_Made(path, {**details, "method": "none", "fusion_applied": False, **_note(notes)}, checked(path)), t0)


# One fp32 candidate: (method, label, what makes it at a path); made in a child, in order, until one matches.
_Maker = tuple[str, str, Callable[[Path], "_Candidate"]]


def _fp32_plan(
    exported: ExportedModel, component: Component, external: bool, settings: Settings
) -> tuple[dict[str, Any], list[str], list[_Maker]]:
    """fp32's details so far, its notes, and its candidates in the order they are tried (none: the plain export)."""
    plain = component.path
    model_type = component.model_type or exported.checkpoint.model_type
    if not settings.optimize:
        unoptimized = {"model_type": model_type, "method": "none", "fusion_applied": False, "fused_ops": {}}
        return unoptimized, ["optimization off (--no-optimize)"], []
    level = settings.optimization
    fusion_type = FUSION_TYPES.get(model_type) if level != "O1" else None
    details: dict[str, Any] = {"model_type": model_type, "level": level, "optimizer_model_type": fusion_type}
    notes: list[str] = []
    candidates: list[_Maker] = []
    if level == "O1":
        candidates.append(("ort_basic", "ORT basic optimization", lambda out: _ort_offline(plain, out, external, basic=True)))
    elif fusion_type is None:
        notes.append(f"model_type {model_type!r} has no transformers optimizer fuser")
    elif _merged_decoder(component):
        # Its layers live in the If branches, where the fusers match nothing: on every merged decoder of the zoo
        # that has a fuser (bart, marian, mbart: it fails; t5, whisper: fused nothing). Trying cost whisper-tiny's
        # decoder 2 s of a 29 s fp32 job at real size, for a graph thrown away. (A top-level If alone says nothing:
        # deberta's graph has one, and its layers outside it fuse.)
        notes.append(f"transformers optimizer ({fusion_type}) not tried: its fusions find nothing in a merged decoder's If branches")
    else:
        opt_level = FUSION_OPT_LEVEL.get(fusion_type, 0)
        details["fusion_opt_level"] = opt_level
        config = _config(exported, component)

        def fused(out: Path) -> _Candidate:
            step("the transformers optimizer", f"fusing {plain.name}")
            return _fuse(plain, out, fusion_type, config, external, opt_level, gelu_approximation=level == "O3")

        label = f"transformers optimizer ({fusion_type}{', GELU approximation' if level == 'O3' else ''})"
        candidates.append(("transformers_optimizer", label, fused))
    if level != "O1":
        candidates.append(("ort_offline", "ORT offline optimization", lambda out: _ort_offline(plain, out, external)))
    return details, notes, candidates


# A made fp32 candidate: its graph, its op census, and what its maker adds to the variant's details.
_Candidate = tuple[Path, Counter[str], dict[str, Any]]


def _note(notes: list[str]) -> dict[str, str]:
    return {"note": "; ".join(notes)} if notes else {}


def _timed(made: _Made, t0: float) -> _Made:
    """Seconds spent making it, its checks not included (they are verify's)."""
    checked = made.verified.seconds if made.verified is not None else 0.0
    made.details["seconds"] = round(time.perf_counter() - t0 - checked, 3)
    return made


def _mismatch(verified: Verified, settings: Settings) -> str:
    """Why a candidate's checks failed, in one line: it did not run, or its worst output and the tolerance."""
    if verified.error is not None:
        return f"did not run: {verified.error}"
    worst = max((c for c in verified.checks if not c.passed), key=lambda c: (c.bound_used, c.max_abs))
    tol = settings.tolerances["fp32"]
    return (
        f"output changed: {worst.output} at {worst.shape}: max abs {worst.max_abs:.3g} (tolerance {tol.describe()}),"
        f" cosine {worst.cosine:.6f}"
    )


def _ships_as_is(plain: Path, external: bool) -> bool:
    """The plain export already has the layout its variant ships in: a big model's, or one without a data file."""
    return external or not onnx_graph.data_path(plain).exists()


def _as_final(plain: Path, out: Path, external: bool) -> Path:
    """The plain export in the layout its variant ships in: weights back inside the graph unless the model is big."""
    if _ships_as_is(plain, external):
        return plain
    step("onnx", f"writing {out.name} with its weights inside")
    model = onnx_graph.load(plain)
    onnx_graph.share_tied(model, plain.parent)
    onnx_graph.save(model, out, external=False, weights=plain.parent)  # copied file to file
    return out


def _fuse(
    plain: Path, out: Path, fusion_type: str, config: dict[str, Any], external: bool, opt_level: int,
    *, gelu_approximation: bool = False,
) -> _Candidate:
    """The transformers optimizer's Python fusions, after ORT's hardware-independent ``opt_level`` (0: none, 1: basic).

    ``gelu_approximation`` turns Gelu into FastGelu (tanh), as optimum's O3 does.

    Without ORT's symbolic shape inference, as optimum's ``--optimize`` runs them: it copies
    the whole model each time a fusion asks (5 times for bert) and keeps the copies.

    ``optimize_model`` given a path loads every weight into the graph, and the fused graph is
    then written with them all: gpt2's 0.65 GB read in 0.8 s and written in 1.2 s of a 7.5 s
    child. The fusers match on the structure and read a weight only to fold it (a bert's Q, K
    and V into one), which onnx reads from its data file when asked: so they are handed the
    graph without its weights, in the folder its data file is in (the working directory, for
    the child's lifetime: run it in a forked child), and the weights they left alone are
    copied file to file into the fused graph. The same graph, byte for byte
    (tests/stages/test_optimize.py). At ``opt_level`` 1 ORT's basic pass runs first, as
    ``optimize_model`` runs it, writing its graph's weights to a data file of its own.
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_by_onnxruntime, optimize_model

    if opt_level not in (0, 1):
        raise ValueError(f"fusion opt_level {opt_level}: only 0 and 1 run ahead of the fusers here")
    heads, hidden = _heads_hidden(config)
    options = FusionOptions(fusion_type)
    options.enable_shape_inference = False
    options.enable_gelu_approximation = gelu_approximation
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".basic-") as basic:
        source = plain.resolve()
        if opt_level == 1:
            written = optimize_by_onnxruntime(
                str(source),
                use_gpu=False,
                optimized_model_path=str(Path(basic) / "model_o1_cpu.onnx"),
                opt_level=1,
                disabled_optimizers=["ConstantSharing"],  # optimize_model's, at every level
                save_as_external_data=True,
            )
            source = Path(written)
        model = onnx_graph.load(source)
        here = os.getcwd()
        os.chdir(source.parent)  # where onnx looks for a weight's data file when a fuser reads one
        try:
            optimizer = optimize_model(
                model,
                model_type=fusion_type,
                num_heads=heads,
                hidden_size=hidden,
                opt_level=0,
                use_gpu=False,
                optimization_options=options,
            )
        finally:
            os.chdir(here)
        stats = {op: n for op, n in optimizer.get_fused_operator_statistics().items() if n}
        onnx_graph.share_tied(optimizer.model, source.parent)
        graph = optimizer.model.graph
        census, contrib = onnx_graph.op_census(graph), _contrib_details_of(graph)
        step("onnx", f"writing {out.name}")
        onnx_graph.save(optimizer.model, out, external=external, weights=source.parent)
    return out, census, {"fused_operator_statistics": stats, **contrib}


def _ort_offline(plain: Path, out: Path, external: bool, *, basic: bool = False) -> _Candidate:
    """ONNX Runtime's own graph optimizations, saved instead of run: extended, or only the basic ones (O1).

    ORT writes the weights it left unchanged as references to the plain export's data file,
    by a path relative to the new graph, which is in another folder, so its graph would not
    load. Given an external-initializers file, it writes every weight afresh instead: the ones
    of at least the size threshold there, the rest inside the graph. A big model's go to a
    data file of its own; a model that ships inline gets a threshold no tensor reaches, so
    ORT writes it whole (written to a data file and put back, a ViT-Base's 0.35 GB was
    written twice and parsed once more: the fp32 child took 3.7-3.9 CPU s, now 2.6-2.7).
    """
    import onnxruntime as ort

    step(ORT, f"optimizing {plain.name}")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if basic else ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    )
    opts.optimized_model_filepath = str(out)
    # ORT writes a tied embedding's transposed copy as it read it: its weights then go to a data file first, where
    # onnx_graph.share_tied compares them without parsing the graph whole, and come back inline without the copy.
    tied = not external and onnx_graph.has_tied(plain)
    if external or tied or onnx_graph.data_path(plain).exists():
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", onnx_graph.data_path(out).name
        )
        least = onnx_graph.EXTERNAL_MIN_BYTES if external or tied else _NEVER_EXTERNAL
        opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", str(least))
    onnx_graph.data_path(out).unlink(missing_ok=True)
    ort.InferenceSession(str(plain), opts, providers=["CPUExecutionProvider"])
    onnx_graph.read_back(out, "ONNX Runtime's optimizer")  # its C++ writer reports no failed write
    if tied:
        model = onnx_graph.load(out)
        onnx_graph.share_tied(model, out.parent)
        step("onnx", f"writing {out.name} with its weights inside")
        inline = out.with_name(f"inline-{out.name}")
        onnx_graph.save(model, inline, external=False, weights=out.parent)
        onnx_graph.delete(out)
        inline.rename(out)
    graph = onnx_graph.structure(out).graph
    return out, onnx_graph.op_census(graph), _contrib_details_of(graph)


# A size threshold for external initializers that no tensor reaches: ORT writes them all inside the graph.
_NEVER_EXTERNAL = 1 << 62


def _fp16(
    exported: ExportedModel,
    component: Component,
    source: Path,
    fp32_method: str,
    out: Path,
    external: bool,
    settings: Settings,
    check: Check | None,
) -> _Made:
    """In the child: float16 weights and compute, float32 inputs and outputs so the same feeds work; then checked."""
    plain = component.path
    if source == plain or fp32_method == "none":  # fp32 is the plain export: no second try
        kept = _save_fp16(plain, out, external)
        details = {"source": "plain export", "io": "keep_io_types", "fp32_nodes": kept}
        return _Made(out, details, _verified(exported, component, "fp16", out, settings, check))
    if _merged(component):
        # Every merged decoder of the zoo failed this way (the If's declared outputs stay float
        # while its branches become float16): converting it only to load and discard it cost
        # 0.3-1.3 s a component.
        kept = _save_fp16(plain, out, external)
        details = {"source": "plain export", "io": "keep_io_types", "fp32_nodes": kept, "note": _MERGED_NOTE}
        return _Made(out, details, _verified(exported, component, "fp16", out, settings, check))
    try:
        kept = _save_fp16(source, out, external)
        details = {"source": f"fp32 ({fp32_method})", "io": "keep_io_types", "fp32_nodes": kept}
        verified = _verified(exported, component, "fp16", out, settings, check)
        return _Made(out, {**details, **_contrib_details(out)}, verified)
    except Exception as exc:  # noqa: BLE001 - retried below from the plain export
        if is_our_bug(exc) or storage_fault(exc) is not None:
            raise
        first = first_line(exc)
    # ORT's converter cannot convert ORT-optimized If branches (merged decoders), or ORT cannot
    # load what it made of them: convert the plain export.
    kept = _save_fp16(plain, out, external)
    retried = {"source": "plain export", "io": "keep_io_types", "fp32_nodes": kept, "note": f"from the fp32 graph failed: {first}"}
    return _Made(out, retried, _verified(exported, component, "fp16", out, settings, check))


_MERGED_NOTE = "ORT's float16 converter leaves an optimized graph's top-level If outputs float: converted the plain export"


def _merged(component: Component) -> bool:
    """Whether the component has a top-level ``If``: a merged decoder's on ``use_cache_branch``, or one the model
    computes (deberta's); either way its branch outputs need what fp16 and the checks do for them.

    Read on the plain export's weightless graph the job holds: its fp32 graph keeps the
    ``If``, but written inline it would be parsed whole (a ViT-Base: 0.35 GB, 0.3 s) to see it.
    """
    return any(node.op_type == "If" for node in component.graph.graph.node)


def _merged_decoder(component: Component) -> bool:
    """Whether the component is optimum's merged decoder: it takes ``use_cache_branch``, its ``If``'s condition."""
    return any(i.name == "use_cache_branch" for i in component.graph.graph.input)


def _save_fp16(source: Path, out: Path, external: bool) -> int:
    """Write the fp16 graph of ``source`` to ``out``; returns how many nodes stayed fp32."""
    step("the float16 converter", f"converting {source.name}")
    model, kept = _to_fp16(source)
    onnx_graph.share_tied(model, source.parent)  # a plain export's copy; a shared fp32 source's stays shared
    step("onnx", f"writing {out.name}")
    onnx_graph.save(model, out, external=external)
    return kept


def _to_fp16(source: Path) -> tuple[onnx.ModelProto, int]:
    """float16 weights and compute, float32 inputs and outputs and index arithmetic kept (see zoo_convert.variants.fp16).

    The converter is handed the element types ONNX's shape inference finds on the graph
    without its weights (:func:`zoo_convert.variants.fp16.prepare`), not ORT's symbolic shape
    inference, which copies the whole model; the converted graph is the same.
    """
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    proto = onnx.load(str(source))
    keep = fp16.prepare(proto)
    with fp16.fast_clamp():
        converted = OnnxModel(
            convert_float_to_float16(proto, keep_io_types=True, node_block_list=keep, disable_shape_infer=True)
        )
    # What ORT's OnnxModel.convert_float_to_float16 does after converting, on the types the
    # graph declares: its symbolic shape inference would copy the whole model again.
    converted.disable_shape_inference()
    converted.remove_cascaded_cast_nodes()
    converted.remove_useless_cast_nodes()
    return converted.model, len(keep)


def _config(exported: ExportedModel, component: Component) -> dict[str, Any]:
    """The config the fuser reads heads and hidden size from: a pipeline component's own, else the checkpoint's."""
    own = getattr(component.onnx_config, "_config", None)
    if component.model_type is None or own is None:
        return exported.checkpoint.config
    return dict(own.to_dict() if hasattr(own, "to_dict") else own)


def _heads_hidden(config: dict[str, Any]) -> tuple[int, int]:
    """Attention heads and hidden size from an HF config; 0 lets the fuser detect them from the graph."""
    heads = _first_int(config, ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads", "n_heads"))
    hidden = _first_int(config, ("hidden_size", "n_embd", "d_model", "dim"))
    if "d_kv" in config and heads and hidden and config["d_kv"] * heads != hidden:
        hidden = config["d_kv"] * heads  # T5's attention width is heads * d_kv, not d_model
    return heads, hidden


def _first_int(config: dict[str, Any], keys: tuple[str, ...]) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if value is not None:
            return 0  # per-stage lists (swin): width varies, let the fuser detect it
    return 0


def _gained(before: Counter[str], after: Counter[str]) -> dict[str, int]:
    return {op: after[op] - before[op] for op in _FUSED_OPS if after[op] > before[op]}


def _summarize(art: Artifact) -> None:
    """Variant-level facts over all components, for the record."""
    parts = art.details["components"].values()
    art.details["seconds"] = round(sum(p.get("seconds", 0.0) for p in parts), 3)
    if art.variant == "fp32":
        art.details["fusion_applied"] = any(p.get("fusion_applied") for p in parts)
        art.details["fused_ops"] = dict(sum((Counter(p.get("fused_ops", {})) for p in parts), Counter()))
        art.details["methods"] = sorted({p["method"] for p in parts if "method" in p})
        art.details["level"] = next((p["level"] for p in parts if "level" in p), None)  # None: --no-optimize
    if REGISTRY[art.variant].quantization is not None:
        art.details["quantization"] = REGISTRY[art.variant].quantization
    if "error" in art.details:
        art.details.setdefault("failure_kind", FailureKind.OPTIMIZE_ERROR.value)

"""Verify stage: ONNX Runtime against PyTorch, per output, at several input shapes.

Inputs and the PyTorch reference come from :mod:`zoo_convert.verify.runtime`, at every
``settings.verify_shapes`` (batch, sequence) pair rather than the export's dummy
shape, so dynamic axes are exercised, and at one long shape: batch 1 at the
length the model is used at (:mod:`zoo_convert.verify.shapes`), where models that
compute differently past a length threshold show whether the graph kept the
long path. Decoders run with a populated past (past length = sequence), and a
merged decoder is checked on both of its branches; a decoder exported with past is also
run the way it is used, 16 greedy steps on ONNX Runtime's own cache against PyTorch
generate() (:mod:`zoo_convert.verify.generation`: each step's logits are checks like the others,
and fp32's own greedy tokens must be PyTorch's). A variant that misses its
tolerance raises :class:`NumericsMismatchError`, which carries every check for
the record; one that missed it at the long shape only says so (``long inputs only``).

PyTorch's side is computed once per job, right after the export (:func:`references`).
ONNX Runtime's side (:func:`check`) runs where each variant is made, in the optimize
stage's forked child, on those memoized references: the child opens the variant's one
session, and it is gone when the child is. :func:`judge` decides in the job's process.

A check can only fail when the reference can tell a right graph from a wrong one:
:func:`inconclusive` names the outputs whose PyTorch values are constant, all zero
or non-finite at every verify input (a tiny MobileViT's logits are exactly 0: every
variant "passes" with max abs 0), and the pipeline records such a variant as
inconclusive, never as passed. A model that samples (:func:`sampling`: a random op in
its graph, or a PyTorch forward that differs from itself) is inconclusive whatever its
numbers: they can neither pass it nor fail it.

The reference is the model as loaded, never as patched for export
(``runtime.as_loaded_forward``); the inputs are what users send (attention masks without
holes, padded at the tokenizer's side), and per-token outputs are compared only at the
tokens the mask keeps.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..errors import (
    GenerationMismatchError,
    NumericsMismatchError,
    VerifyError,
    is_our_bug,
)
from ..records import OutputCheck, Settings, Tolerance
from ..verify import generation, shapes
from ..verify.compare import compare, peak
from ..job import Ahead, Branch, CaseKey, GenerationAhead
from ..verify.runtime import Case, cases, feed_for, session_for
from . import Artifact, Component, ExportedModel, Verified

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

FP16_SMALLEST_NORMAL = float(np.finfo(np.float16).tiny)
# ONNX ops that draw random numbers: a graph that has one gives other outputs on every run.
RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
)


def references(exported: ExportedModel, settings: Settings) -> None:
    """PyTorch's side, once per job: its outputs at every verify shape of every component (memoized).

    Called right after the export, so the torch model can be released as soon as
    nothing else needs it and the variants are checked in forked children that
    never run torch.
    """
    for _ in _cases(exported, settings):
        pass
    generation.reference(exported, settings)


def references_ahead(
    exported: ExportedModel, settings: Settings
) -> tuple[dict[tuple[CaseKey, Branch], Ahead], GenerationAhead | None]:
    """PyTorch's outputs at every verify shape of ``exported``'s components, in a child forked before the export.

    ``exported`` is provisional: its components carry the torch modules and OnnxConfigs the export
    is about to run, and no graph yet (two decoders optimum is about to merge: the merged decoder,
    its config flagged as the merge will flag it). The export leaves a CPU idle (torch.onnx's tracing
    and graph passes run on one), where this runs on one thread; :func:`references` then takes each
    case's outputs from here instead of running the forward again, where its own inputs for the case
    are the very ones fed here (``runtime._made_ahead``). A component that fails here is left to the
    job, which fails it with its own error. The decoder's generation is computed here too, where its
    inputs are known before the export (``generation.reference_ahead``). Returns ``RuntimeCache.ahead``
    and ``.generation_ahead``.
    """
    exported.cache.torch_only = True
    one = replace(settings, threads=1)
    for comp in exported.components:
        with contextlib.suppress(Exception):
            for _ in cases_of(exported, comp, one):
                pass
    generation.reference_ahead(exported, one)
    return exported.cache.ahead, exported.cache.generation_ahead


def save_references(exported: ExportedModel, settings: Settings) -> int:
    """Save every verify case (feed, PyTorch's outputs, keep-masks) and the tolerances beside the artifacts.

    Written to ``<artifacts>/reference/`` (:mod:`zoo_convert.targets.reference`), so any runtime
    can be checked against the very reference the farm used, with no PyTorch and no checkpoint.
    Returns the bytes written. Generation steps are not saved: a target checks single forwards.
    """
    from ..targets import reference

    saved = []
    for comp, case, long in _cases(exported, settings):
        outputs = {n: case.reference[n] for n in case.outputs if n in case.reference}
        saved.append((comp.name, case.label, long, case.feed, outputs, case.keep))
    return reference.save(exported.out_dir, saved, settings.tolerances,
                          model_type=exported.checkpoint.model_type, task=exported.checkpoint.task)  # fmt: skip


def check(exported: ExportedModel, artifact: Artifact, comp: Component, settings: Settings) -> Verified:
    """ONNX Runtime's side for one component of ``artifact``: every output at every verify shape, against PyTorch.

    Raises VerifyError when ONNX Runtime cannot load the graph or run an input; whether
    the checks meet the tolerance is :func:`judge`'s call.
    """
    tol = _tolerance(settings, artifact.variant)
    t0 = time.perf_counter()
    checks: list[OutputCheck] = []
    prompt = generation.prompt_feed(exported, comp)  # where comp is the encoder the decoder's generation reads
    encoded = None
    for case_comp, case, _ in _cases(exported, settings, only=comp):
        session = session_for(exported, artifact, case_comp, settings)
        outputs = _run_ort(session, case, case_comp)
        for name, ort_value in outputs.items():
            output = _recorded(exported, case_comp, name)
            checks.append(compare(output, case.label, case.reference[name], ort_value, tol, keep=case.keep.get(name)))
        if prompt is not None and encoded is None:
            encoded = generation.encoded_from(session, prompt, case.feed, outputs)
    if prompt is not None and encoded is None:
        with contextlib.suppress(VerifyError):  # the decoder's check tries again, and fails with the reason
            encoded = generation.encode_prompt(session_for(exported, artifact, comp, settings), prompt, comp)
    generated = generation.check(exported, artifact, comp, settings, tol)
    checks += generated.checks if generated is not None else ()
    return Verified(tuple(checks), round(time.perf_counter() - t0, 4), generation=generated, encoded=encoded)


def verify(exported: ExportedModel, artifact: Artifact, settings: Settings) -> tuple[OutputCheck, ...]:
    """Compare ``artifact`` against PyTorch at every verify shape; NumericsMismatchError when it misses its tolerance."""
    for comp in exported.components:
        artifact.verified[comp.name] = check(exported, artifact, comp, settings)
    checks = [c for comp in exported.components for c in artifact.verified[comp.name].checks]
    return judge(exported, artifact, tuple(checks), settings)


def judge(exported: ExportedModel, artifact: Artifact, checks: tuple[OutputCheck, ...], settings: Settings) -> tuple[OutputCheck, ...]:
    """The checks if every one met the variant's tolerance; else NumericsMismatchError naming the worst."""
    tol = _tolerance(settings, artifact.variant)
    at_long: dict[tuple[str, str], str] = {}  # (output, shape) checked at the long shape -> what its length counts
    peaks: dict[tuple[str, str], float] = {}
    for comp, case, long in _cases(exported, settings):
        for name in case.outputs:
            output = _recorded(exported, comp, name)
            if name in case.reference:
                peaks[output, case.label] = peak(case.reference[name])
            if long:
                at_long[output, case.label] = shapes.length_unit(comp.onnx_config)
    failed = [c for c in checks if not c.passed]
    if failed:
        # The worst is the check whose element went furthest past its elementwise bound.
        worst = max(failed, key=lambda c: (np.nan_to_num(c.bound_used, nan=np.inf), np.nan_to_num(c.max_abs, nan=np.inf),
                                           -c.cosine))  # fmt: skip
        long_only = None
        if all((c.output, c.shape) in at_long for c in failed):
            long_only = f"{worst.shape} (batch x {at_long[worst.output, worst.shape]})"
        note = ""
        top = peaks.get((worst.output, worst.shape), np.inf)
        if artifact.variant == "fp16" and top < FP16_SMALLEST_NORMAL:
            note = (
                f"; PyTorch's {worst.output} peaks at |x| = {top:.3g}, below"
                f" float16's smallest normal value {FP16_SMALLEST_NORMAL:.3g}: fp16 cannot carry these outputs"
            )
        raise NumericsMismatchError(worst=worst, tolerance=tol, checks=checks, long_only=long_only, note=note)
    _judge_tokens(artifact, checks, tol)
    return checks


def _judge_tokens(artifact: Artifact, checks: tuple[OutputCheck, ...], tol: Tolerance) -> None:
    """fp32's own greedy tokens must be PyTorch generate()'s; a near tie in PyTorch's logits is no divergence.

    The other variants' token match is recorded as information: quantized logits may pick
    another of two close candidates and still be within their tolerance.
    """
    found = [v.generation for v in artifact.verified.values() if v.generation is not None and v.generation.checks]
    if artifact.variant != "fp32" or not found:
        return
    gen = found[0]
    if gen.first_mismatch is None or gen.tie or gen.token_match is None:
        return
    raise GenerationMismatchError(
        worst=gen.checks[gen.first_mismatch], tolerance=tol, checks=checks, token_match=gen.token_match,
        first_mismatch=gen.first_mismatch, steps=gen.steps,
    )  # fmt: skip


def _tolerance(settings: Settings, variant: str) -> Tolerance:
    tol = settings.tolerances.get(variant)
    if tol is None:
        raise VerifyError(f"no tolerance configured for variant {variant!r}")
    return tol


def inconclusive(exported: ExportedModel, settings: Settings) -> str | None:
    """Why a verification against these PyTorch outputs proves nothing, or None when it proves something.

    An output counts when its reference is the same at every verify input: non-finite
    everywhere, all zero, or one constant value. Any such output makes the verdict
    inconclusive: a graph that computed nothing would have matched it.
    """
    values: dict[str, list[np.ndarray]] = {}
    labels: list[str] = []
    for comp, case, _ in _cases(exported, settings):
        labels += [] if case.label.split("/")[0] in labels else [case.label.split("/")[0]]
        for name in case.outputs:
            ref = np.asarray(case.reference[name], dtype=np.float64).ravel()
            values.setdefault(_recorded(exported, comp, name), []).append(ref)
    found = []
    for output, parts in values.items():
        flat = np.concatenate(parts)
        finite = flat[np.isfinite(flat)]
        if not finite.size:
            found.append(f"{output} is non-finite")
        elif finite.size == flat.size and not finite.any():
            found.append(f"{output} is all zero")
        elif finite.size == flat.size and finite.min() == finite.max():
            found.append(f"{output} is constant ({finite[0]:.6g})")
    if not found:
        return None
    return (
        f"inconclusive: PyTorch's {'; '.join(found)} at every verify input ({', '.join(labels)}),"
        " so matching it proves nothing"
    )


def sampling(exported: ExportedModel) -> str | None:
    """Why no comparison of this model's outputs can be judged: it samples; None when it does not.

    A graph with a random op (:data:`RANDOM_OPS`: VITS's noise, SpeechT5's prenet
    dropout as exported) or a PyTorch forward that gave other outputs on the same input a
    second time (``RuntimeCache.unrepeatable``, measured by ``references``) cannot be
    told from a wrong graph by its numbers: the verdict is inconclusive, not a mismatch.
    """
    from .. import onnx_graph

    found = []
    for comp in exported.components:
        ops = sorted({n.op_type for g in onnx_graph.graphs(comp.graph.graph) for n in g.node if n.op_type in RANDOM_OPS})
        if ops:
            found.append(f"{comp.path.name} draws random numbers ({', '.join(ops)})")
        differ = exported.cache.unrepeatable.get(comp.name)
        if differ:
            found.append(f"PyTorch's {comp.name} differs from itself on the same input ({', '.join(differ)})")
    if not found:
        return None
    return f"inconclusive: the model samples: {'; '.join(found)}, so no two runs of it can be compared"


def _cases(
    exported: ExportedModel, settings: Settings, only: Component | None = None
) -> Iterator[tuple[Component, Case, bool]]:
    """(component, case, at the long shape) at every verify shape, one case per branch of a merged decoder."""
    for comp in exported.components if only is None else [only]:
        for case, long in cases_of(exported, comp, settings):
            yield comp, case, long


def cases_of(exported: ExportedModel, comp: Component, settings: Settings) -> Iterator[tuple[Case, bool]]:
    """(case, at the long shape) of one component at every verify shape, one case per branch of a merged decoder."""
    if comp.onnx_config is None:
        raise VerifyError(f"component {comp.name} carries no OnnxConfig/torch module to generate inputs from")
    done: set[str] = set()
    for shape in shapes.verify_shapes(comp.onnx_config, exported.checkpoint.path, settings):
        found = cases(exported, comp, shape.batch, shape.sequence, settings, audio_samples=shape.audio_samples)
        # A whisper encoder's long shape is its 30 s window again: checked once.
        for case in (c for c in found.values() if c.label not in done):
            done.add(case.label)
            yield case, shape.long


def _recorded(exported: ExportedModel, comp: Component, name: str) -> str:
    """An output as the record names it: prefixed with its component when there are several."""
    return f"{comp.name}/{name}" if len(exported.components) > 1 else name


def _run_ort(session: InferenceSession, case: Case, comp: Component) -> dict[str, np.ndarray]:
    graph_outputs = {o.name for o in session.get_outputs()}
    missing = [n for n in case.outputs if n not in case.reference or n not in graph_outputs]
    if missing:
        raise VerifyError(f"{comp.name}: outputs {missing} missing from the graph or from PyTorch at {case.label}")
    names = list(case.outputs)
    try:
        values = session.run(names, feed_for(session, case, comp))
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
        if is_our_bug(exc):
            raise
        raise VerifyError(f"ONNX Runtime failed on {comp.name} at {case.label}: {exc}") from exc
    return dict(zip(names, values))

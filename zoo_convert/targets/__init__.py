"""Deployment targets: the runtimes a variant is checked on, from the reference saved beside it.

    ort-cpu          ONNX Runtime, CPU provider: today's check (the verdict that makes ``passed`` stays verify's)
    openvino         the openvino package's CPU plugin, at f32 inference precision
    transformers.js  the pinned @huggingface/transformers in node (tests/js), loading the folder by dtype name
    ort-cuda         ONNX Runtime's CUDA provider (GPU nodes only; a CPU fallback is ``not-run``, never a GPU result)
    ort-tensorrt     ONNX Runtime's TensorRT provider (likewise)

Each is one module with a :class:`~.base.Target` and one :func:`register` line below.
:func:`check` runs one variant on one target against a :class:`~.reference.Reference` and
returns a :class:`~zoo_convert.records.TargetResult`; a target never changes the ORT verdict.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from .. import node
from ..errors import MESSAGE_LIMIT, TargetError, TargetNotRun, TargetUnsupported
from ..records import FAILED, NOT_RUN, PASSED, UNSUPPORTED, OutputCheck, TargetResult, Tolerance
from ..variants import REGISTRY
from ..verify.compare import compare, dims
from .base import Ran, Target
from .reference import Reference, SavedCase, SavedOutput, load

# Timed calls of a target's first case, after the checks warmed it up.
TIMED_CALLS = 5

_REGISTRY: dict[str, Target] = {}


def register(target: Target) -> Target:
    """Make ``target`` known by its name (``--targets``, the manifest column, ``verify-target``)."""
    _REGISTRY[target.name] = target
    return target


def names() -> tuple[str, ...]:
    """Every registered target, in registration order."""
    return tuple(_REGISTRY)


def get(name: str) -> Target:
    """The registered target of that name; KeyError naming the known ones."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown target {name!r}: known are {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def installed() -> tuple[str, ...]:
    """The targets that can run on this node: the default set of a job."""
    return tuple(name for name, t in _REGISTRY.items() if t.unavailable() is None)


def check(target: Target, reference: Reference, variant: str, *, timed: int = TIMED_CALLS) -> TargetResult:
    """``variant`` of ``reference.folder`` on ``target``: every saved case against PyTorch's outputs, at the variant's tolerance.

    A wrong output shape is a failure; an error the runtime raises is the row's message.
    """
    return check_variants(target, reference, (variant,), timed=timed)[0]


def check_variants(
    target: Target,
    reference: Reference,
    variants: Sequence[str],
    *,
    timed: int = TIMED_CALLS,
    doing: Callable[[str], None] | None = None,
    ready: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[TargetResult]:
    """:func:`check` of each of ``variants``, one row each in their order, the runtime started once for them all
    where it can (:meth:`~.base.Target.run_variants`). ``timed`` calls of the first case give ``latency_ms``
    (0: not timed, None); with ``ready``, after every variant was checked and once ``ready()`` returns. A row's
    ``seconds`` are read on ``clock`` (a farm job's leaves out the windows it was paused in)."""
    t0 = clock()
    version = target.version()
    rows: dict[str, TargetResult] = {}
    why = target.unavailable()
    runnable: dict[str, dict[str, Path]] = {}
    graphs: dict[str, str] = {}  # the graph files each variant ran: onnx/standard/ where the target reads standard ops
    for variant in variants:
        files = reference.files(variant, standard=target.standard_ops)
        if why is not None:
            rows[variant] = TargetResult(target.name, variant, NOT_RUN, version=version, message=why)
        elif reference.tolerances.get(variant) is None or not files:
            rows[variant] = TargetResult(target.name, variant, NOT_RUN, version=version,
                                         message=f"the saved reference has no {variant} graphs")  # fmt: skip
        else:
            runnable[variant] = files
            graphs[variant] = ",".join(str(p.relative_to(reference.folder)) for p in files.values())
    spent = clock() - t0
    judged: dict[str, tuple[TargetResult, float]] = {}  # variant -> its row and the seconds judging it took

    def judge(variant: str, run: Ran) -> None:
        t1 = clock()
        row = _judged(target.name, version, variant, run, reference, reference.tolerances[variant])
        judged[variant] = row, clock() - t1

    def parked(checked: Mapping[str, Ran]) -> None:
        for variant, run in checked.items():  # judged now, not in the latency phase the timed calls wait for
            judge(variant, run)
        if ready is not None:
            ready()

    ran = (target.run_variants(reference.folder, runnable, reference.cases, timed=timed, doing=doing,
                               ready=parked if ready is not None else None, clock=clock)
           if runnable else {})  # fmt: skip
    for variant, run in ran.items():
        if variant not in judged:
            judge(variant, run)
        row, judging = judged[variant]
        rows[variant] = replace(row, latency_ms=_latency(row, run), seconds=round(run.elapsed + judging, 4),
                                graph=graphs[variant])  # fmt: skip
    first = variants[0] if variants else None
    out = []
    for variant in variants:
        row = rows[variant]
        if row.message is not None and len(row.message) > MESSAGE_LIMIT:
            row = replace(row, message=row.message[:MESSAGE_LIMIT] + " ...")
        if row.seconds is None or variant == first:  # the first row carries what the rows share
            row = replace(row, seconds=round((row.seconds or 0.0) + spent, 4))
        out.append(row)
    return out


# The targets whose integer products are ONNX Runtime's CPU kernels: MatMulInteger runs on the CPU under its GPU
# providers too (uint8 activations), and transformers.js on Node is onnxruntime-node.
ORT_KERNELS = frozenset({"ort-cpu", "ort-cuda", "ort-tensorrt", "transformers.js"})
# Why an int8 graph that verified fails under ONNX Runtime on this node (verify checked its exact sums: optimize._checked).
SATURATES = ("this CPU (x86 without VNNI or AMX) saturates the int8 graph's products in ONNX Runtime, as every such CPU "
             "will; its uint8 variant does not")  # fmt: skip


def _judged(name: str, version: str | None, variant: str, run: Ran, reference: Reference, tol: Tolerance) -> TargetResult:
    """One variant's row from what the target answered."""
    base = TargetResult(target=name, variant=variant, status=NOT_RUN, version=version, providers=run.providers)
    if run.error is not None:
        return replace(base, status=_status(run.error), message=str(run.error))
    checks: list[OutputCheck] = []
    errors: list[str] = []
    for case, answer in zip(reference.cases, run.answers, strict=True):
        if isinstance(answer, TargetNotRun):
            return replace(base, message=str(answer))
        if isinstance(answer, TargetError):
            errors.append(f"{case.component} at {case.label}: {answer}")
            continue
        checks += [compare_saved(case, out, answer.get(out.name), tol) for out in case.outputs]
    failed = [c for c in checks if not c.passed]
    if errors:
        status, message = FAILED, f"{name} failed on {'; '.join(errors)}"
    elif failed:
        status, message = FAILED, _worst(failed, tol)
        if name in ORT_KERNELS and variant in REGISTRY and REGISTRY[variant].options.get("weight_type") == "int8":
            if node.int8_saturates():
                message = f"{SATURATES}: {message}"
    else:
        status, message = PASSED, None
    return replace(base, status=status, message=message, checks=tuple(checks),
                   max_abs=max((c.max_abs for c in checks), default=None),
                   min_cosine=min((c.cosine for c in checks), default=None))  # fmt: skip


def _latency(row: TargetResult, run: Ran) -> float | None:
    """The median of the timed calls, only where the target passed: a figure for wrong answers would be read as a
    deployable one."""
    return round(float(np.median(run.seconds)) * 1000, 4) if run.seconds and row.status == PASSED else None


def compare_saved(case: SavedCase, out: SavedOutput, got: np.ndarray | None, tol: Tolerance) -> OutputCheck:
    """One output of a target's answer against the saved reference; its full shape must be the reference's."""
    name = f"{case.component}/{out.name}"
    if got is None:
        return OutputCheck(name, case.label, float("inf"), float("inf"), float("inf"), 0.0, passed=False,
                           mismatch="output missing")  # fmt: skip
    got = np.asarray(got)
    if tuple(got.shape) != out.shape:
        return OutputCheck(name, case.label, float("inf"), float("inf"), float("inf"), 0.0, passed=False,
                           mismatch=f"shape {dims(got.shape)} from the target, {dims(out.shape)} in PyTorch")  # fmt: skip
    if out.index is not None:
        return compare(name, case.label, out.values, got.ravel()[out.index], tol)
    return compare(name, case.label, out.values, got, tol, keep=out.keep)


def _worst(failed: list[OutputCheck], tol: Tolerance) -> str:
    worst = max(failed, key=lambda c: (np.nan_to_num(c.max_abs, nan=np.inf), -c.cosine))
    if worst.mismatch:
        return f"{worst.output} at {worst.shape}: {worst.mismatch}"
    return (f"{worst.output} at {worst.shape}: max abs {worst.max_abs:.3g} (tolerance {tol.max_abs:.3g}),"
            f" cosine {worst.cosine:.6f} (tolerance {tol.min_cosine}); {len(failed)} check(s) failed")  # fmt: skip


def _status(exc: TargetError) -> str:
    if isinstance(exc, TargetUnsupported):
        return UNSUPPORTED
    if isinstance(exc, TargetNotRun):
        return NOT_RUN
    return FAILED


def check_folder(folder: Path, target: str, variants: tuple[str, ...] | None = None) -> list[TargetResult]:
    """Every variant (or those asked) of an artifact folder on one target, from its saved reference."""
    reference = load(folder)
    chosen = variants or tuple(reference.variants)
    return check_variants(get(target), reference, chosen)


def _register_builtin() -> None:
    from .ort_cpu import OrtCpu
    from .ort_gpu import OrtCuda, OrtTensorRT
    from .openvino import OpenVINO
    from .transformers_js import TransformersJs

    for target in (OrtCpu(), OpenVINO(), TransformersJs(), OrtCuda(), OrtTensorRT()):
        register(target)


_register_builtin()

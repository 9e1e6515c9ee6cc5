"""The per-model pipeline: one checkpoint in, verified ONNX artifacts and one record out.

``convert_one`` never raises for a model's fault: every exception becomes a
recorded :class:`ConversionResult` with its stage and failure kind. It knows
nothing of Ray or DuckDB, so it runs the same in the CLI, a test, or a farm job.
Importing it changes no process-wide state: the entry points that convert (the
CLI, the fork server) call :func:`quiet_libraries` themselves.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
import json
import os
import resource
import shutil
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import (
    MESSAGE_LIMIT,
    STRUCTURE_FAILED,
    FailureKind,
    FetchError,
    NumericsMismatchError,
    OutputDirError,
    ZooConvertError,
    first_line,
    storage_fault,
)
from .records import (
    FAILED,
    INCONCLUSIVE,
    PASSED,
    ConversionResult,
    ManifestEntry,
    OutputCheck,
    Settings,
    StageResult,
    VariantResult,
)
from .stages import Artifact, ExportedModel, Latency
from .stages.forked import alone_on_node, note_claimed, paused_windows
from . import node

if TYPE_CHECKING:
    from .job import GenerationAhead
    from .stages.forked import Parked
    from .stages.target import Pending

# Called with "stage" or "stage[variant]" as each stage starts: the farm's isolation layer
# leaves it where a crash can still say where the job died.
StageCallback = Callable[[str], None]


def convert_one(
    entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None, alone: bool = False
) -> ConversionResult:
    """Fetch, export, check, optimize, verify and benchmark (unless switched off) one checkpoint; never raises.

    ``alone``: this process converts this one checkpoint and nothing after it (the CLI's ``convert``), so what
    its library does not need is kept out of its imports (:func:`_keep_to_library`).
    """
    from .stages import benchmark, check, export, fetch, optimize, target, verify

    if entry.optimize is not None:  # the row's level, for this job only
        settings = replace(settings, optimization=entry.optimize)
    run = _Run(entry, on_stage)
    out_dir: Path | None = None
    checked: _TargetRows | None = None
    ahead = _ReferencesAhead(settings) if settings.threads > 1 else None
    try:
        with run.stage("fetch"):
            ckpt = fetch.fetch(entry, settings, on_disk=_keep_to_library if alone else None)
            run.facts.update(
                task=ckpt.task,
                model_type=ckpt.model_type,
                library=ckpt.library,
                resolved_revision=ckpt.resolved_revision,
            )
        with run.stage("export") as details:
            out_dir = claim_artifacts_dir(artifacts_dir(settings, entry, ckpt.resolved_revision))
            exported = export.export(ckpt, entry, settings, out_dir, ahead=ahead.start if ahead else None)
            details.update(files=exported.files, **exported.details)
            run.facts.update(
                opset=exported.opset,
                ir_version=exported.ir_version,
                node_count=exported.node_count,
                op_census=exported.op_census,
                artifacts_dir=str(out_dir),
                exporter_used=exported.details.get("exporter"),
                exporter_reason=exported.details.get("generic"),
            )
        with run.stage("check") as details:
            details.update(check.check(exported))
        with run.stage("verify") as details:
            # What the user changed of verify's defaults, in the record: its shapes and the fp32 tolerance.
            fp32 = settings.tolerances["fp32"]
            details.update(shapes=dict(settings.shapes), fp32_max_abs=fp32.max_abs, fp32_rtol=fp32.rtol)
            if ahead is not None:
                ahead.into(exported, details)
            missing = _references(exported, settings, details)
        if settings.benchmark and missing is None and benchmark.too_big_to_hold(exported, settings):
            # PyTorch's side now, alone: optimize's children would add each variant's copy to the torch model.
            with run.stage("benchmark") as details:
                benchmark.time_torch_alone(exported, settings)
                details["torch_alone"] = True
            _release_torch(exported)
        names = target.chosen(entry, settings)  # the deployment targets this job is checked on
        with run.stage("optimize") as details:
            standard = target.wants_standard(names)  # graphs of standard ops only for a target that reads them
            artifacts = optimize.optimize(exported, entry.variants, settings, check=verify.check, standard=standard)
            details.update({v: a.details for v, a in artifacts.items()})
            target.record_variants(exported, artifacts)
            export.set_modes(out_dir)
        run.variants = _one_structure([_unmade(a) if "error" in a.details else _verified(run, exported, a, missing, settings)
                                       for a in artifacts.values()])  # fmt: skip
        if names and missing is None:
            # Timed alone, in the latency phase: parked (checked now, their runtimes kept loaded until then), or
            # for a big model loaded again there (target.time_alone).
            park = settings.benchmark and target.parks(exported)
            with run.stage("target") as details:
                details.update(targets=list(names))
                try:  # a target never changes the verdict: not even a bug of ours in checking one
                    pending = target.check(exported, run.variants, names, timed=target.TIMED_CALLS if park else 0,
                                           park=park)  # fmt: skip
                    checked = _TargetRows(pending, details, run)
                    if not park:
                        checked.record()
                except Exception as exc:  # noqa: BLE001 - kept in the stage's details, with its traceback
                    details.update(error=_failure(exc).message, traceback=_failure(exc).traceback)
        if settings.benchmark:
            run.variants = _benchmarked(run, exported, artifacts, settings, checked)
        if checked is not None:
            checked.record()  # parked checks no benchmark asked for (no variant to time)
            checked.close()  # the parked checks exit now, past the job's latency phase
        for comp in exported.components:
            comp.release_torch()
    except Exception as exc:  # noqa: BLE001 - the pipeline's one error boundary
        if ahead is not None:
            ahead.close()
        if checked is not None:
            checked.close()
        run.fail(exc)
        # No result points at it, or the machine failed the job (a full disk: the space is wanted back, and the
        # next try claims a folder of its own): leave no folder behind.
        machine = not FailureKind(run.failure["failure_kind"]).terminal
        if out_dir is not None and ("artifacts_dir" not in run.facts or machine):
            _discard(out_dir, Path(settings.out_dir))
            run.facts.pop("artifacts_dir", None)
        if "model_type" not in run.facts:  # failed before fetch vetted it: config.json may still say
            run.facts["model_type"] = fetch.config_model_type(entry, settings)
    return run.result(settings)


def _references(exported: ExportedModel, settings: Settings, details: dict[str, object]) -> Exception | None:
    """PyTorch's side of the job, first: verify's references, and the benchmark's inputs when it times.

    Returns the error that kept the references from being computed (each variant then fails
    verify with it, as it would have checking them one by one). Without a benchmark the
    torch model is released right away; with one, after the benchmark timed it (a model too
    big to hold through optimize: before optimize, alone).
    """
    from .stages import benchmark, verify

    t0 = time.perf_counter()
    try:
        verify.references(exported, settings)
    except Exception as exc:  # noqa: BLE001 - recorded on every variant's verify
        return exc
    finally:
        # What the child computed and the job did not take: asked for other inputs, or not asked (references failed).
        if exported.cache.ahead:
            details["references_ahead_unused"] = len(exported.cache.ahead)
            exported.cache.ahead.clear()
        if exported.cache.generation_ahead is not None:
            details["generation_ahead"] = "not taken"
            exported.cache.generation_ahead = None
    # Beside the artifacts, for any runtime anywhere (zoo_convert.targets): no PyTorch needed to re-check.
    details["reference_bytes"] = verify.save_references(exported, settings)
    if settings.benchmark:
        with contextlib.suppress(Exception):  # memoized: the benchmark notes it for every variant
            benchmark.bench_cases(exported, settings)
    exported.cache.references_done = True
    details["references_seconds"] = round(time.perf_counter() - t0, 4)
    if not settings.benchmark:
        _release_torch(exported)
    return None


# The least time the job waits for the references computed beside its export, once the export is done.
_AHEAD_GRACE_S = 30.0


class _ReferencesAhead:
    """verify's PyTorch forwards computed in a child forked just before the export runs, beside it.

    torch.onnx's export leaves a CPU idle (its tracing and graph passes run on one): on a machine with more
    than one (``convert``; never a farm job, which runs on one), the child computes the forwards of every
    verify case on one thread there, and the decoder's generation, and the job's verify takes them
    (``stages.verify.references_ahead``). A child that failed, crashed or ran out of time costs nothing but
    its seconds: the job computes the cases itself, as without it. Not for a model over the external-data
    threshold: its activations beside the export's peak.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.child: Parked[tuple[dict[Any, Any], GenerationAhead | None]] | None = None
        self.started = 0.0

    def start(self, early: ExportedModel) -> bool:
        """Fork the child (export's ``ahead``); whether it runs."""
        from .stages import benchmark, verify
        from .stages.forked import start_forked, step

        settings = self.settings
        if not early.components or benchmark.too_big_to_hold(early, settings):
            return False

        def forwards() -> tuple[dict[Any, Any], GenerationAhead | None]:
            import torch

            step("PyTorch", "computing verify's references beside the export")
            torch.set_num_threads(1)  # see stages.forked: the fork brought no OpenMP pool along
            return verify.references_ahead(early, settings)

        self.child = start_forked(forwards, timeout_s=settings.timeout_s)
        self.started = time.monotonic()
        return True

    def into(self, exported: ExportedModel, details: dict[str, object]) -> None:
        """The child's outputs into the job's cache, and in the record how many cases it computed (or why none)."""
        if self.child is None:
            return
        # Waited for no longer than it has run already, the export's time: a child held up past that (a fork
        # that inherited a lock) costs the job no more than its own references would have.
        self.child.timeout_s = max(_AHEAD_GRACE_S, time.monotonic() - self.started)
        try:
            made, generated = self.child.result()
        except Exception as exc:  # noqa: BLE001 - the job computes the cases itself
            details["references_ahead"] = f"none: {first_line(exc)}"
        else:
            exported.cache.ahead.update(made)
            exported.cache.generation_ahead = generated
            details["references_ahead"] = len(made)
            if generated is not None:
                details["generation_ahead"] = "taken"  # unless the job's generation does not take it (_references)
        finally:
            self.close()

    def close(self) -> None:
        if self.child is not None:
            self.child.close()
            self.child = None


def _release_torch(exported: ExportedModel) -> None:
    """Drop the torch model before optimize forks its children, and free it now.

    A transformers model is held in reference cycles: unlinked, it stays resident until the
    collector runs, and every child forked meanwhile counts it too (llama-style, 2.3 GB: the
    job's peak was the parent's 2.9 GB plus the fp16 child's 4.2 GB).
    """
    for comp in exported.components:
        comp.release_torch()
    gc.collect()


def _verified(
    run: _Run, exported: ExportedModel, artifact: Artifact, missing: Exception | None, settings: Settings
) -> VariantResult:
    """Judge one variant on the checks its optimize child ran; a failure fails this variant only."""
    from .stages import verify

    base = VariantResult(
        variant=artifact.variant,
        status=FAILED,
        file=str(artifact.files[exported.components[0].name].relative_to(exported.out_dir)),
        size_bytes=artifact.size_bytes,
        optimizer=artifact.details,
        **next((v.generation.summary() for v in artifact.verified.values() if v.generation is not None), {}),
    )
    checks: list[OutputCheck] = []
    try:
        with run.stage("verify", variant=artifact.variant) as details:
            if missing is not None:
                raise missing
            for comp in exported.components:
                found = artifact.verified[comp.name]
                # ONNX Runtime's side ran in the optimize child: the writer adds it to this variant's verify_s.
                details["checks_seconds"] = round(details.get("checks_seconds", 0.0) + found.seconds, 4)
                checks.extend(found.checks)
                if found.error is not None:
                    kind = found.error_kind or FailureKind.VERIFY_ERROR.value
                    return replace(_checked(base, tuple(checks)), failure_kind=kind, message=found.error,
                                   traceback=found.traceback)  # fmt: skip
            sampled = verify.sampling(exported)
            if sampled is not None:  # numbers that can neither pass nor fail it
                return replace(_checked(base, tuple(checks)), status=INCONCLUSIVE, message=sampled)
            base = _checked(base, verify.judge(exported, artifact, tuple(checks), settings))
            why = verify.inconclusive(exported, settings)
        return replace(base, status=PASSED if why is None else INCONCLUSIVE, message=why)
    except NumericsMismatchError as exc:
        return replace(_checked(base, exc.checks), failure_kind=exc.kind.value, message=exc.message)
    except Exception as exc:  # noqa: BLE001 - a variant's failure is data
        failure = _failure(exc)
        return replace(base, failure_kind=failure.kind, message=failure.message, traceback=failure.traceback)


def _one_structure(variants: list[VariantResult]) -> list[VariantResult]:
    """A variant is no better than the export it was made from: fp32 failing numerics fails every other variant.

    fp32 is the export itself (optimized only where the optimized graph still matched), so its
    numerics failure is the structure's (a wrong attention path frozen at export); an fp16 or
    int8 of it may still land inside its looser tolerance. Each keeps its own numbers and checks.
    """
    fp32 = next((v for v in variants if v.variant == "fp32"), None)
    if fp32 is None or fp32.failure_kind != FailureKind.VERIFY_NUMERICS.value:
        return variants
    return [
        v if v is fp32 or v.status == FAILED
        else replace(v, status=FAILED, failure_kind=fp32.failure_kind,
                     message=_cut(f"{STRUCTURE_FAILED} ({_own(v)}): {fp32.message}"))
        for v in variants
    ]  # fmt: skip


def _own(v: VariantResult) -> str:
    """What a variant's own checks said, for the message that fails it with its fp32's verdict."""
    if v.status == INCONCLUSIVE:
        return f"{v.variant}'s own checks: {v.message}"
    if v.max_abs is None or v.min_cosine is None:
        return f"{v.variant}'s own checks passed"
    return f"{v.variant}'s own checks passed: max abs {v.max_abs:.3g}, min cosine {v.min_cosine:.6f}"


def _cut(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + " ..."


class _TargetRows:
    """A job's target checks (:class:`~zoo_convert.stages.target.Pending`) until their rows are in the record."""

    def __init__(self, pending: Pending, details: dict[str, Any], run: _Run) -> None:
        self.pending, self.details, self.run = pending, details, run
        self.recorded = False

    def record(self) -> None:
        """The rows in the job's facts and the target stage's details (once; parked checks time their variants now)."""
        from .stages import target

        if self.recorded:
            return
        self.recorded = True
        rows = self.pending.rows()
        self.run.facts["targets"] = tuple(target.without_checks(rows))
        self.details.update(statuses=target.summary(rows))

    def close(self) -> None:
        self.pending.close()


def _benchmarked(
    run: _Run, exported: ExportedModel, artifacts: dict[str, Artifact], settings: Settings, checked: _TargetRows | None
) -> list[VariantResult]:
    """Every verified variant and PyTorch (once) timed, with the node to this job alone in a farm; never fails a variant.

    In a farm job the benchmark waits for the node's latency phase (``forked.alone_on_node``):
    no conversion runs on the node while it is timed; the deployment targets' passed variants are
    timed there too: by their parked checks (``checked``), or loaded again (``target.time_alone``).
    The stage's details keep the wait, the wall-clock window it was timed in and the CPUs it was
    pinned to (a node times as many jobs at once as it has lanes: farm.driver._NodeLeases).
    """
    from .stages import benchmark, target

    timed = [artifacts[v.variant] for v in run.variants if v.status in (PASSED, INCONCLUSIVE)]
    if not timed:
        return run.variants
    with alone_on_node() as waited, run.stage("benchmark") as details:
        started = time.time()
        latencies = benchmark.benchmark(exported, timed, settings)
        t1 = time.perf_counter()
        if checked is not None and not checked.recorded:  # parked: each target times what it checked, alone now
            checked.record()
            details["targets_seconds"] = round(time.perf_counter() - t1, 4)
        elif rows := list(run.facts.get("targets", ())):  # too big to park: each target loaded again, timed alone
            run.facts["targets"] = tuple(target.time_alone(exported, rows))
            details["targets_seconds"] = round(time.perf_counter() - t1, 4)
        details.update(variants=sorted(latencies), noisy=sorted(v for v, lat in latencies.items() if lat.noisy),
                       lease_wait_s=round(waited, 4), window=[round(started, 4), round(time.time(), 4)],
                       cpus=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None)
    return [_with_latency(v, latencies[v.variant]) if v.variant in latencies else v for v in run.variants]


def _with_latency(v: VariantResult, lat: Latency) -> VariantResult:
    """The record's latency columns: figures, conditions, and why a side is missing."""
    return replace(v, **lat.columns(), traceback=v.traceback or lat.traceback)  # type: ignore[arg-type]


def _unmade(artifact: Artifact) -> VariantResult:
    """A variant the optimize stage could not build: recorded as failed, the others go on."""
    return VariantResult(
        variant=artifact.variant,
        status=FAILED,
        failure_kind=artifact.details["failure_kind"],
        message=artifact.details["error"],
        traceback=artifact.traceback,
        optimizer=artifact.details,
    )


@dataclass(frozen=True)
class _Failure:
    """What an exception means for the record: its kind, one line, and where it came from."""

    kind: str
    message: str
    traceback: str


def _failure(exc: BaseException) -> _Failure:
    """Anything not raised on purpose as one of our errors is ``internal``; a full or failing disk is ``storage_error``."""
    kind = exc.kind if isinstance(exc, ZooConvertError) else FailureKind.INTERNAL
    if not isinstance(exc, FetchError) and storage_fault(exc) is not None:
        kind = FailureKind.STORAGE_ERROR  # writing artifacts failed: the disk's fault, redone by the next run
    return _Failure(kind.value, first_line(exc), "".join(traceback.format_exception(exc)))


def _checked(variant: VariantResult, checks: tuple[OutputCheck, ...]) -> VariantResult:
    """The variant with its output checks and the worst of their numbers."""
    if not checks:
        return replace(variant, outputs=checks)
    return replace(
        variant,
        outputs=checks,
        max_abs=max(c.max_abs for c in checks),
        max_rel=max(c.max_rel for c in checks),
        mean_abs=max(c.mean_abs for c in checks),
        min_cosine=min(c.cosine for c in checks),
    )


def artifacts_dir(settings: Settings, entry: ManifestEntry, resolved_revision: str) -> Path:
    """``OUT/<source name>/<exporter>-opset<N>-<revision[:12]>-<settings hash>``: the folder a job's artifacts go in.

    Every setting that changes the artifacts' bytes is part of the name (:func:`artifact_settings`):
    a ``--no-optimize`` run never lands in the folder of an optimized one. :func:`claim_artifacts_dir`
    then takes a folder of that name no job wrote yet.
    """
    name = entry.source.rstrip("/").replace("\\", "/")
    name = "__".join(p for p in name.split("/")[-2:] if p not in ("", ".", ".."))
    rev = resolved_revision.split(":")[-1][:12]
    opset = entry.opset if entry.opset is not None else "default"
    digest = hashlib.sha256(json.dumps(artifact_settings(settings, entry), sort_keys=True).encode()).hexdigest()[:8]
    return Path(settings.out_dir) / name / f"{entry.exporter}-opset{opset}-{rev}-{digest}"


def artifact_settings(settings: Settings, entry: ManifestEntry) -> dict[str, Any]:
    """What decides the bytes of a job's artifacts besides the checkpoint, exporter and opset (the folder name's hash)."""
    return {
        "task": entry.task,
        "variants": sorted(entry.variants),
        "optimize": settings.optimize,
        "external_data_threshold": settings.external_data_threshold,
        "providers": list(settings.providers),  # the fusions depend on the execution provider
        "allow_remote_code": entry.allow_remote_code,
        "versions": node.toolchain_versions(),
    }


def claim_artifacts_dir(path: Path) -> Path:
    """A folder of ``path``'s name that no job wrote before, made now: a recorded artifact is never replaced in place.

    A job run again (``--force``, a checkpoint back at an earlier version) gets ``<name>.2``,
    ``<name>.3``... The folder is made exclusively, so two jobs never share one. An output
    folder that cannot be made at all is the machine's fault (:class:`OutputDirError`).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for n in itertools.count(1):
            candidate = path if n == 1 else path.with_name(f"{path.name}.{n}")
            try:
                candidate.mkdir()
                note_claimed(candidate)  # a child killed from here on leaves no folder (isolation)
                return candidate
            except FileExistsError:
                continue
    except OSError as exc:
        if storage_fault(exc) is not None:
            raise
        raise OutputDirError(f"cannot make the artifact folder {path}: {exc.strerror or exc}") from exc
    raise AssertionError("unreachable")  # itertools.count never ends


def _discard(out_dir: Path, out_root: Path) -> None:
    """Remove a failed job's artifact folder that no result points at, and its model's folder when that is left empty."""
    shutil.rmtree(out_dir, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: another job's artifacts are in it
        if out_dir.parent != out_root:
            out_dir.parent.rmdir()


def _keep_to_library(path: Path) -> None:
    """In a process converting the checkpoint at ``path`` and nothing else: diffusers kept out unless it is a pipeline.

    Told by fetch before anything imports optimum's exporter, which imports diffusers wherever it is installed
    (:func:`node.no_diffusers`).
    """
    from .exporters import diffusion

    if not diffusion.is_pipeline(path):
        node.no_diffusers()


class _Run:
    """Collects stage timings and the first failure of one conversion."""

    def __init__(self, entry: ManifestEntry, on_stage: StageCallback | None) -> None:
        self.entry = entry
        self.on_stage = on_stage
        self.started_at, self.t0 = _now(), time.time()
        self.stages: list[StageResult] = []
        self.variants: list[VariantResult] = []
        self.facts: dict[str, Any] = {}
        self.failure: dict[str, Any] = {}
        self._current = "fetch"

    @contextlib.contextmanager
    def stage(self, name: str, **labels: str) -> Iterator[dict[str, Any]]:
        details: dict[str, Any] = dict(labels)
        self._current = name
        if self.on_stage is not None:
            self.on_stage(name + "".join(f"[{v}]" for v in labels.values()))
        t0, w0 = time.perf_counter(), time.time()
        status = FAILED
        try:
            yield details
            status = PASSED
        finally:
            # A farm job stopped while its node's latency phase timed others: not this stage's seconds.
            paused = paused_windows(w0)
            self.stages.append(
                StageResult(
                    stage=name,
                    status=status,
                    seconds=round(time.perf_counter() - t0 - sum(b - a for a, b in paused), 4),
                    peak_mem_mb=_peak_rss_mb(),
                    details=details,
                )
            )

    def fail(self, exc: BaseException) -> None:
        failure = _failure(exc)
        self.failure = {
            "failure_kind": failure.kind,
            "stage": self._current,
            "message": failure.message,
            "traceback": failure.traceback,
        }

    def _failed_stage(self, variant: VariantResult) -> str:
        """The stage a variant failed in; one that optimize could not build never reached another."""
        failed = (s.stage for s in self.stages if s.status == FAILED and s.details.get("variant") == variant.variant)
        return next(failed, "optimize")

    def result(self, settings: Settings) -> ConversionResult:
        entry = self.entry
        status = FAILED if self.failure else _status(entry, self.variants)
        failure = dict(self.failure)
        if not failure and status == FAILED:
            failed = [v for v in self.variants if v.status == FAILED]
            bad = next((v for v in failed if v.variant == "fp32"), failed[0])  # the others may carry fp32's verdict
            failure = {
                "failure_kind": bad.failure_kind,
                "stage": self._failed_stage(bad),
                "message": f"{bad.variant}: {bad.message}",
                "traceback": bad.traceback,
            }
        if status == INCONCLUSIVE:
            why = next(v for v in self.variants if v.status == INCONCLUSIVE)
            failure = {"message": f"{why.variant}: {why.message}"}
        return ConversionResult(
            source=entry.source,
            status=status,
            task=self.facts.get("task", entry.task),
            revision=entry.revision,
            exporter=entry.exporter,
            opset_requested=entry.opset,
            stages=tuple(self.stages),
            variants=tuple(self.variants),
            versions=node.toolchain_versions(),
            started_at=self.started_at,
            finished_at=_now(),
            paused=tuple((round(a, 4), round(b, 4)) for a, b in paused_windows(self.t0)),
            node=socket.gethostname(),
            row=entry.row,
            tags=entry.tags,
            **{k: v for k, v in self.facts.items() if k != "task"},
            **failure,
        )


def _status(entry: ManifestEntry, variants: list[VariantResult]) -> str:
    """fp32 decides when it was asked for; otherwise every variant must pass (or be inconclusive, then so is the job)."""
    by_name = {v.variant: v for v in variants}
    if "fp32" in by_name:
        return by_name["fp32"].status
    statuses = {v.status for v in variants}
    if not variants or FAILED in statuses:
        return FAILED
    return INCONCLUSIVE if INCONCLUSIVE in statuses else PASSED


def quiet_libraries() -> None:
    """Silence the exporters' tracer chatter in this process: what matters is recorded.

    Entry points that convert call it (the CLI's ``convert``, the fork server before
    its warm-up); importing or calling the pipeline never does.
    """
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*TracerWarning.*")
    # torch.utils.flop_counter: a CUDA wheel without triton warns on import that it cannot count triton's flops (we
    # count none).
    loggers = ("transformers", "optimum", "onnxruntime", "root", "torch.onnx", "onnxscript", "torch.utils.flop_counter")
    for name in loggers:
        logging.getLogger(name if name != "root" else None).setLevel(logging.ERROR)
    # transformers and optimum set their root logger's level when first imported, to this variable's level or
    # WARNING, over the one set above (convert printed their "`torch_dtype` is deprecated" and "requires accelerate"
    # notices). Not through their setters: importing optimum.utils here would decide that diffusers is installed
    # before node.no_diffusers can say otherwise.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # a download's bars would land between our own lines
    try:
        from torch.jit._trace import (
            TracerWarning,  # torch.jit re-exports it without marking it public
        )

        warnings.filterwarnings("ignore", category=TracerWarning)
    except ImportError:
        pass


@contextlib.contextmanager
def toolchain_frozen() -> Iterator[StageCallback]:
    """An ``on_stage`` for a process that converts one model (the CLI's ``convert``): once the export begins, the
    toolchain's objects (~470,000 after torch, transformers, onnx and optimum's exporter are imported) are moved out
    of the garbage collector's sight (``gc.freeze``), as the farm's fork server does before it forks its jobs.

    Every full collection walked them: the one that frees the torch model before optimize forks (0.23 s at any model
    size) and those Python runs by itself during the export; each walk writes to their headers, pages the forked
    children then copy. vit-base's fp32 ``convert``: 10.6-11.0 -> 9.8-10.5 s (AMD EPYC). The freeze comes before the
    model is loaded, so the model and the job's objects are still collected; it is undone on the way out, so a
    process that goes on (a test) collects its frozen garbage again.
    """

    froze = False

    def on_stage(stage: str) -> None:
        nonlocal froze
        if stage == "export" and not froze and not gc.get_freeze_count():  # a fork-server job's heap is frozen already
            import optimum.exporters.onnx.convert  # noqa: F401 - every exporter's first import, made before the freeze

            gc.freeze()
            froze = True

    try:
        yield on_stage
    finally:
        if froze:
            gc.unfreeze()


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")

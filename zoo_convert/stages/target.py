"""Target stage: every made variant checked on each deployment target, from the reference saved beside it.

Runs after verify has judged the variants on ONNX Runtime, and never changes that verdict: each
(variant, target) is its own :class:`~zoo_convert.records.TargetResult`. Each target runs in a
short-lived forked child (:mod:`zoo_convert.stages.forked`): a runtime that crashes or hangs on a graph
fails that target's rows, not the job. A variant ONNX Runtime failed is not run elsewhere
(``not-run``, saying so); the reference the targets read is ``<artifacts>/reference/``
(:mod:`zoo_convert.targets.reference`), written by verify before optimize.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .. import targets as registry
from ..errors import first_line
from .forked import Parked, run_forked, step, unpaused_clock, wait_for_go
from ..records import FAILED, NOT_RUN, PASSED, ManifestEntry, Settings, TargetResult, VariantResult
from ..targets import reference
from ..targets.base import Target
from . import Artifact, ExportedModel

# A target's whole check of one job (every variant) may take this long before it is a failure.
TIMEOUT_S = 300.0


def chosen(entry: ManifestEntry, settings: Settings) -> tuple[str, ...]:
    """The targets a job is checked on: the row's, else the run's, else every target installed on this node."""
    if entry.targets is not None:
        return entry.targets
    if settings.targets is not None:
        return settings.targets
    return registry.installed()


def wants_standard(names: tuple[str, ...]) -> bool:
    """Whether one of ``names`` reads a variant's graph of standard ONNX ops (the optimize stage then makes it)."""
    return any(name in registry.names() and registry.get(name).standard_ops for name in names)


def record_variants(exported: ExportedModel, artifacts: dict[str, Artifact]) -> None:
    """Write each made variant's graph files into the saved reference's manifest (before the folder's modes are set)."""
    if not reference.exists(exported.out_dir):
        return
    done = {v: a for v, a in artifacts.items() if "error" not in a.details}
    made = {v: {comp: _rel(exported, path) for comp, path in a.files.items()} for v, a in done.items()}
    # A variant's graphs of standard ONNX ops: its own where they hold no contrib op, else those written beside them.
    standard = {
        v: {comp: _rel(exported, a.standard.get(comp, path)) for comp, path in a.files.items()}
        for v, a in done.items()
        if all(comp in a.standard or not a.details["components"].get(comp, {}).get("contrib_ops") for comp in a.files)
    }
    reference.add_variants(exported.out_dir, made, standard)


def _rel(exported: ExportedModel, path: Path) -> str:
    return str(path.relative_to(exported.out_dir))


# A job whose weights are above this checks its targets one variant loaded at a time and has them timed by
# time_alone (each runtime loaded again in the latency phase): parked, every target holds all its variants at once.
PARK_MAX_BYTES = 1 << 30
# Timed calls of each target's passed variants (their first saved case).
TIMED_CALLS = registry.TIMED_CALLS


def parks(exported: ExportedModel) -> bool:
    """Whether the job's target checks may wait for its latency phase with their variants loaded (:func:`check`)."""
    weights = exported.details.get("weights_bytes")
    return not isinstance(weights, int) or weights <= PARK_MAX_BYTES


class Pending:
    """One job's target checks, each target in a forked child (:class:`~.forked.Parked`); :meth:`rows` gives the rows.

    A parked child has checked its variants and holds them loaded until :meth:`rows` lets it time
    them; having answered, it waits for :meth:`close` to exit (not in the job's latency phase:
    :class:`~.forked.Parked`). :meth:`close` also ends whatever is still running (a job that failed on the way).
    """

    def __init__(self, rows: list[TargetResult], order: dict[str, int], names: tuple[str, ...]) -> None:
        self._rows, self._order, self._names = rows, order, names
        self._children: list[tuple[str, Target, tuple[str, ...], Parked[list[TargetResult]]]] = []
        self._answered: list[Parked[list[TargetResult]]] = []

    def rows(self) -> list[TargetResult]:
        """Every (variant, target) row, in variant then target order; parked children time their variants now."""
        while self._children:
            name, target, runnable, child = self._children.pop(0)
            self._answered.append(child)
            try:
                self._rows += child.result()
            except Exception as exc:  # noqa: BLE001 - a target that crashes or hangs fails its own rows only
                message = f"{name}: {first_line(exc)}"
                self._rows += [TargetResult(name, v, FAILED, version=target.version(), message=message) for v in runnable]
        return sorted(self._rows, key=lambda r: (self._order.get(r.variant, 99),
                                                 self._names.index(r.target) if r.target in self._names else 99))  # fmt: skip

    def close(self) -> None:
        """Let every child go (those that answered exit, those still parked are killed), then reap them: their exits
        run side by side."""
        children = self._answered + [child for *_, child in self._children]
        for child in children:
            child.let_go()
        for child in children:
            child.reap()
        self._children, self._answered = [], []


def check(exported: ExportedModel, variants: list[VariantResult], names: tuple[str, ...], *,
          timed: int = registry.TIMED_CALLS, park: bool = False) -> Pending:  # fmt: skip
    """Every (variant, target) row of a job; ONNX Runtime's failed variants are recorded as not run elsewhere.

    ``timed`` calls of each variant's first case give its ``latency_ms`` (0: None; docs/targets.md). With
    ``park``, each target's child checks its variants, keeps them loaded and waits (``forked.wait_for_go``):
    their ``timed`` calls run when :meth:`Pending.rows` is asked, in the job's latency phase. The targets
    are checked one after the other (each parks before the next starts).
    """
    order = {v.variant: i for i, v in enumerate(variants)}
    pending = Pending([], order, names)
    if not names or not reference.exists(exported.out_dir):
        return pending
    ref = reference.load(exported.out_dir)
    runnable = tuple(v.variant for v in variants if v.status != FAILED and v.variant in ref.variants)
    for name in names:
        try:
            target = registry.get(name)
        except KeyError as exc:
            pending._rows += [TargetResult(name, v.variant, NOT_RUN, message=str(exc.args[0])) for v in variants]
            continue
        pending._rows += [TargetResult(name, v.variant, NOT_RUN, version=target.version(),
                                       message=f"not checked: {v.variant} failed verification on ONNX Runtime ({v.failure_kind})")
                          for v in variants if v.variant not in runnable]  # fmt: skip
        if not runnable:
            continue

        def run(target: Target = target) -> list[TargetResult]:
            def doing(variant: str) -> None:
                step(target.name, f"checking {variant}")

            # Rows' seconds on a clock that stops while the job is paused (a phase timing others on its node).
            return registry.check_variants(target, ref, runnable, timed=timed, doing=doing,
                                           ready=wait_for_go if park else None, clock=unpaused_clock)  # fmt: skip

        pending._children.append((name, target, runnable, Parked(run, timeout_s=TIMEOUT_S)))
    return pending


def time_alone(exported: ExportedModel, rows: list[TargetResult], *, calls: int = registry.TIMED_CALLS) -> list[TargetResult]:
    """Each target's passed variants timed on the first saved case, in the job's latency phase; the rows with ``latency_ms``.

    For a job too big to park (:func:`parks`): the checks ran beside the node's conversions untimed
    (``check(..., timed=0)``); here the node is the job's alone (``forked.alone_on_node``), one forked
    child per target loads each runtime again, every session on 1 thread: the first call of the case
    warms it up, then ``calls`` timed calls give the median. A target that fails to time leaves its
    rows without a latency.
    """
    passed: dict[str, list[str]] = {}
    for r in rows:
        if r.status == PASSED:
            passed.setdefault(r.target, []).append(r.variant)
    if not passed or not reference.exists(exported.out_dir):
        return rows
    ref = reference.load(exported.out_dir)
    first = ref.cases[:1]
    found: dict[tuple[str, str], float] = {}
    for name, variants in passed.items():
        target = registry.get(name)
        files = {v: ref.files(v, standard=target.standard_ops) for v in variants}

        def run(target: Target = target, files: dict[str, dict[str, Path]] = files) -> dict[str, float]:
            step(target.name, "timing")
            ran = target.run_variants(ref.folder, files, first, timed=calls)
            return {v: round(float(sorted(r.seconds)[len(r.seconds) // 2]) * 1000, 4)
                    for v, r in ran.items() if r.error is None and r.seconds}  # fmt: skip

        try:
            found.update({(name, v): ms for v, ms in run_forked(run, timeout_s=TIMEOUT_S).items()})
        except Exception:  # noqa: BLE001 - an untimed target keeps its verdict, without a latency
            continue
    return [replace(r, latency_ms=found.get((r.target, r.variant))) for r in rows]


def summary(rows: list[TargetResult]) -> dict[str, dict[str, int]]:
    """target -> status -> rows, for the stage's details."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        out.setdefault(r.target, {}).setdefault(r.status, 0)
        out[r.target][r.status] += 1
    return out


def without_checks(rows: list[TargetResult]) -> list[TargetResult]:
    """The rows as recorded: per-output checks are dropped past the first 50 per row (huge models)."""
    return [replace(r, checks=r.checks[:50]) for r in rows]

"""The one interface every deployment target implements, and the errors it answers with.

A target loads one variant's graph files and runs saved cases (:mod:`.reference`) on them,
returning each output as numpy, or raising the runtime's own error (the errors live in
:mod:`zoo_convert.errors`):

* :class:`TargetUnsupported`: the runtime has no code for this model at all ("not an
  architecture transformers.js knows"): the result is ``unsupported``, never ``failed``;
* :class:`TargetNotRun`: the target cannot run on this node (not installed, no device, or
  the runtime fell back to another device than the one it names): ``not-run``;
* :class:`TargetError`: the runtime failed to compile or run it: ``failed``, with its message.

Adding a target is one module with one :class:`Target` subclass and one
``registry.register(...)`` line in :mod:`zoo_convert.targets`.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TargetError as TargetError
from ..errors import TargetNotRun as TargetNotRun
from ..errors import TargetUnsupported as TargetUnsupported
from .reference import SavedCase

# One case's outputs by graph output name, and the seconds of each timed call (empty when not timed).
Outputs = dict[str, np.ndarray]
# A parked check's loaded variants, once timed: kept until its process exits (Target.run_variants).
_OUTLIVE: list[Loaded] = []


class Loaded(ABC):
    """One variant's graphs loaded in a target: run cases, then close.

    Attributes:
        providers: what really runs the graphs (ONNX Runtime's session providers, OpenVINO's device).
    """

    providers: str | None = None

    @abstractmethod
    def run(self, case: SavedCase) -> Outputs:
        """The case's outputs (every output the case checks); TargetError with the runtime's message."""

    def run_all(self, cases: Sequence[SavedCase], *, timed: int = 0) -> tuple[list[Outputs | TargetError], list[float]]:
        """Every case's outputs or error, and ``timed`` timed calls of the first case (seconds each)."""
        answers: list[Outputs | TargetError] = []
        for case in cases:
            try:
                answers.append(self.run(case))
            except TargetError as exc:
                answers.append(exc)
        seconds = self.time(cases[0], timed) if cases and timed and not isinstance(answers[0], TargetError) else []
        return answers, seconds

    def time(self, case: SavedCase, calls: int) -> list[float]:
        """Seconds of each of ``calls`` calls of ``case`` (the checks before them warmed the sessions up)."""
        seconds = []
        for _ in range(calls):
            t0 = time.perf_counter()
            self.run(case)
            seconds.append(time.perf_counter() - t0)
        return seconds

    def close(self) -> None:  # noqa: B027 - most runtimes free on garbage collection
        """Free the runtime's sessions."""


@dataclass
class Ran:
    """What one variant's run on a target gave: every case's answer, or the error that stopped them all.

    Attributes:
        answers: one per case, its outputs or the runtime's error on it (empty when ``error`` is set).
        error: the error that stopped the variant (loading it, or the runtime as a whole), else None.
        seconds: the timed calls of the first case (empty when not timed).
        providers: what really ran it (see :attr:`Loaded.providers`).
        elapsed: seconds this variant took here (loading, running, timing); the first variant of a
            :meth:`Target.run_variants` that shares a process start carries that start.
    """

    answers: list[Outputs | TargetError] = field(default_factory=list)
    error: TargetError | None = None
    seconds: list[float] = field(default_factory=list)
    providers: str | None = None
    elapsed: float = 0.0


class Target(ABC):
    """A runtime a variant can be deployed on.

    Attributes:
        name: the registered name (``--targets``, the manifest's ``targets`` column, the record).
        gpu: it needs a GPU (scheduled only on GPU nodes; never "installed" on a CPU node).
        standard_ops: it is given a variant's graphs of standard ONNX ops where the folder records
            them (``reference.standard``), not ONNX Runtime's fused ones: a runtime other than ONNX
            Runtime, which has no kernels for its contrib ops.
    """

    name: str = ""
    gpu: bool = False
    standard_ops: bool = False

    @abstractmethod
    def version(self) -> str | None:
        """The runtime's version; None when it is not installed on this node."""

    def unavailable(self) -> str | None:
        """Why it cannot run on this node, or None when it can."""
        return None if self.version() is not None else f"{self.name} is not installed on this node"

    def preload(self) -> None:  # noqa: B027 - most runtimes cost nothing to import, or are imported anyway
        """Import the runtime in a process that will fork the checks (the farm's fork server), so no check pays it.

        Only what is safe to fork: modules, no session, no thread pool in use."""

    @abstractmethod
    def load(self, folder: Path, variant: str, files: dict[str, Path]) -> Loaded:
        """``variant``'s graphs (component -> file) of the artifact folder ``folder``, ready to run."""

    def run_variants(
        self,
        folder: Path,
        variants: Mapping[str, dict[str, Path]],
        cases: Sequence[SavedCase],
        *,
        timed: int = 0,
        doing: Callable[[str], None] | None = None,
        ready: Callable[[Mapping[str, Ran]], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> dict[str, Ran]:
        """Every case on each variant (variant -> its graph files), one variant loaded at a time.

        A target whose runtime costs a process start overrides this to pay it once for them all
        (transformers.js: one node process per job). ``doing`` hears which variant runs now.
        With ``ready``, the ``timed`` calls wait: every variant is checked and kept loaded, then
        ``ready(ran)`` is given what the checks answered (its caller judges them there, before the
        latency phase, which their timed calls alone need) and blocks
        until the node is this job's alone (``forked.wait_for_go``), then each is timed; a variant's
        ``elapsed`` leaves that wait out. ``elapsed`` is read on ``clock``:
        a farm job's stops while the job is paused (``stages.forked.unpaused_clock``).
        """
        ran: dict[str, Ran] = {}
        kept: dict[str, Loaded] = {}
        for variant, files in variants.items():
            if doing is not None:
                doing(variant)
            t0 = clock()
            try:
                loaded = self.load(folder, variant, files)
            except TargetError as exc:
                ran[variant] = Ran(error=exc, elapsed=clock() - t0)
                continue
            keep = False
            try:
                answers, seconds = loaded.run_all(cases, timed=0 if ready is not None else timed)
                ran[variant] = Ran(answers, None, seconds, loaded.providers)
                keep = ready is not None and bool(timed) and bool(answers) and not isinstance(answers[0], TargetError)
            except TargetError as exc:
                ran[variant] = Ran(error=exc, providers=loaded.providers)
            finally:
                if keep:
                    kept[variant] = loaded
                else:
                    loaded.close()
            ran[variant].elapsed = clock() - t0
        if kept and ready is not None:
            ready(ran)
            for variant, loaded in kept.items():
                t0 = clock()
                with contextlib.suppress(TargetError):  # checked already: it keeps its verdict, without a latency
                    ran[variant].seconds = loaded.time(cases[0], timed)
                ran[variant].elapsed += clock() - t0
            # Neither closed nor dropped (dropped, they would be destroyed as this returns): a parked check runs in a
            # child that answers in its job's latency phase and exits after it, and destroying OpenVINO's compiled
            # models of t5's three variants took that phase 150 ms against their timed calls' 8 ms.
            _OUTLIVE.extend(kept.values())
        return ran


def graph_input_types(path: Path) -> dict[str, Any]:
    """Graph input name -> numpy dtype, as the ONNX file declares (an fp16 graph takes float16)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {
        i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        for i in model.graph.input
        if i.type.HasField("tensor_type")
    }


def cast_feed(feed: dict[str, np.ndarray], types: dict[str, Any], component: str) -> dict[str, np.ndarray]:
    """The saved feed for a graph: only its inputs, float ones cast to its declared float type."""
    out = {}
    for name, dtype in types.items():
        if name not in feed:
            raise TargetError(f"{component}: graph input {name!r} has no saved value")
        value = feed[name]
        if value.dtype.kind == "f" and np.dtype(dtype).kind == "f" and value.dtype != dtype:
            value = value.astype(dtype)
        out[name] = value
    return out

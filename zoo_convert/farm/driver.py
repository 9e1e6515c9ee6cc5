"""The farm driver: manifest -> plan -> Ray tasks -> one DuckDB row set per job.

The only module that imports ray. The driver reads and validates the manifest,
keys every job (:mod:`zoo_convert.farm.plan`), drops the keys the results DB already
answers and, when nothing is left, stops there without starting Ray. Otherwise
it submits one Ray task per job (highest priority first, a bounded number in
flight), consumes results as they finish (``ray.wait``) and records each in its
own transaction: the driver is the database's only writer, and a driver killed
mid-run loses nothing that was recorded, so rerunning the command finishes the rest.
One run per database at a time: a run holds the database's run lock
(:mod:`zoo_convert.store.lock`) from planning (the DB's answers) to its end, and
marks runs left ``running`` by a killed driver ``abandoned``; reading and
validating the manifest, which never touches the DB, comes before it.

Ray never retries anything itself (``max_retries=0``, ``retry_exceptions=False``:
it would retry an OOM-killed task forever). The driver resubmits jobs whose
failure is transient (:attr:`FailureKind.transient`: worker or node lost, OOM,
network errors while fetching) with exponential backoff, up to ``max_attempts``,
and records how many attempts it took. Inside a task, the job runs in a warm
forked child (:mod:`zoo_convert.farm.isolation`) so hangs, crashes and OOMs are results.

The Hub rations requests per token, so the driver and every worker draw them from
one budget (:mod:`zoo_convert.farm.hub_budget`): planning paces its resolutions with a
local budget, which then moves into a Ray actor when the cluster starts. A task
downloads its hub checkpoint's files (by the commit planning resolved) under that
budget before it hands the job to its forked child, which finds them on disk and
asks the Hub nothing. Hub ids planning could not resolve for the moment are tried
again during the run, with the same backoff as transient job failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, TypeVar

import ray
import ray.exceptions
from ray.actor import ActorProxy
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..errors import (
    FailureKind,
    ManifestError,
    OutputDirError,
    UnsafeForkServerError,
    ZooConvertError,
    first_line,
    printable,
)
from ..manifest import Manifest, read_manifest
from ..pipeline import convert_one
from ..records import INCONCLUSIVE, PASSED, ConversionResult, ManifestEntry, Settings
from ..sources import is_local
from ..stages.fetch import download
from ..store.db import ResultStore
from ..store.lock import run_lock
from ..store.queries import latest_job_statuses, run_label
from ..node import toolchain_versions
from . import hub_budget
from .hub_budget import Budget, HubLimits, LocalGovernor
from .isolation import JobFn, failure_result, fork_server, preload_for, run_isolated
from .plan import InvalidRow, Job, keyed_jobs, make_plan

_T = TypeVar("_T")
MAX_BACKOFF_S = 60.0
MAX_LISTED = 20  # failures named at the end of a run; the rest are counted
FIELD_LIMIT = 300  # characters of a name or message on a line of the run's output
# The machine's faults (a full or failing disk, lost workers and nodes): when this many jobs in a
# row (or every job of a smaller run) meet the same one, the run stops instead of recording the rest.
MACHINE_FAULTS = frozenset({FailureKind.STORAGE_ERROR, FailureKind.WORKER_LOST})
STOP_AFTER_JOBS = 3
# Ray's NodeDiedError names the node a lost task ran on: every task of one dead node is one fault, not one each.
_DEAD_NODE = re.compile(r"node ID: ([0-9a-f]+)")
# Jobs per CPU of a node that may wait for its latency phase before new conversions wait for the phase.
BENCH_BACKLOG_PER_CPU = 4


@dataclass(frozen=True)
class FarmOptions:
    """How a run is executed (what is converted comes from the manifest and Settings).

    Attributes:
        address: Ray address (``auto``, ``ray://HOST:10001``); None starts a local instance.
        num_cpus: CPUs of a local instance (None: all of this machine).
        max_in_flight: jobs submitted at once; None is twice the cluster's CPUs.
        force: rerun every job, recorded or not.
        retry_failed: rerun jobs whose latest result failed.
        max_attempts: runs of one job when its failures are transient.
        backoff_s: wait before the second attempt; doubles per attempt, capped at a minute.
        hub_limits: the Hub request budget the whole run (driver and workers) shares.
        wait: when another run holds the database, wait for it instead of stopping.
        bench_lanes: benchmarks a node times at once in its latency phase, each pinned to CPUs of its own
            (None: its CPUs over the benchmark's threads; 1: one at a time, on the whole node).
    """

    address: str | None = None
    num_cpus: int | None = None
    max_in_flight: int | None = None
    force: bool = False
    retry_failed: bool = False
    max_attempts: int = 3
    backoff_s: float = 2.0
    hub_limits: HubLimits = HubLimits()
    wait: bool = False
    bench_lanes: int | None = None


@dataclass
class FarmReport:
    """What a run did.

    Attributes:
        run_id: the ``runs`` row of this run.
        name: its unique human name, if it was given one.
        total: jobs and invalid rows in the manifest.
        skipped: those already answered in the DB.
        skipped_by_status: the skipped ones by their latest result's status (passed, failed, ...).
        recorded: results written by this run.
        ray_started: whether the run needed Ray at all.
        by_status: recorded jobs by status (passed: converted, the fp32 artifact verified;
            inconclusive: verified against a PyTorch reference that proves nothing).
        partial: converted jobs in which another variant failed.
        variants / variants_verified: variant artifacts made, and those that verified.
        by_kind: failures by kind, a failed job's and each failed variant of a converted job.
        failures: the first ``MAX_LISTED`` of those failures; n_failures counts them all.
        inconclusive: the first ``MAX_LISTED`` inconclusive jobs (not failures, not passes).
        retries: resubmissions after transient failures.
        unresolved: hub ids the Hub could not resolve yet; at the end, those left for the next run (nothing recorded).
        seconds: wall time of the run.
        stopped: why the run stopped early (every job met the same fault of the machine), else None.
        latency: per node, its latency phases: how many, their seconds, of which draining the node's
            conversions and timing its jobs (:class:`_NodeLeases`); empty without a benchmark.
    """

    run_id: str
    name: str | None = None
    total: int = 0
    skipped: int = 0
    skipped_by_status: Counter[str] = field(default_factory=Counter)
    recorded: int = 0
    ray_started: bool = False
    by_status: Counter[str] = field(default_factory=Counter)
    partial: int = 0
    variants: int = 0
    variants_verified: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    failures: list[FailureLine] = field(default_factory=list)
    n_failures: int = 0
    inconclusive: list[FailureLine] = field(default_factory=list)
    retries: int = 0
    unresolved: int = 0
    seconds: float = 0.0
    stopped: str | None = None
    latency: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The run as people see it: its name with its id, or its id."""
        return run_label(self.run_id, self.name)

    def count(self, result: ConversionResult) -> None:
        """Add one recorded job to the counts and the list of failures."""
        self.recorded += 1
        self.by_status[result.status] += 1
        self.partial += result.partial
        self.variants += len(result.variants)
        self.variants_verified += sum(v.status == PASSED for v in result.variants)
        if result.status == INCONCLUSIVE:
            if len(self.inconclusive) < MAX_LISTED:
                self.inconclusive.append(FailureLine(result.source, None, INCONCLUSIVE, "verify", result.message))
            return
        lines = [] if result.passed else [
            FailureLine(result.source, None, result.failure_kind or "unknown", result.stage or "job", result.message)]
        if result.passed:
            lines += [FailureLine(result.source, v.variant, v.failure_kind or "unknown", result.failed_stage(v), v.message)
                      for v in result.variants if v.status != PASSED]
        for line in lines:
            self.by_kind[line.kind] += 1
            self.n_failures += 1
            if len(self.failures) < MAX_LISTED:
                self.failures.append(line)


@dataclass(frozen=True)
class FailureLine:
    """One failure as the end of a run lists it: a job that did not convert, or a variant of one that did."""

    source: str
    variant: str | None
    kind: str
    stage: str
    message: str | None

    def cells(self) -> tuple[str, str, str, str]:
        """model (with the variant), kind, stage, first line of the message."""
        model = f"{self.source} [{self.variant}]" if self.variant else self.source
        first = (self.message or "").strip().splitlines()
        return printable(model, FIELD_LIMIT), self.kind, self.stage, printable(first[0], FIELD_LIMIT) if first else ""


@ray.remote(max_retries=0, retry_exceptions=False, max_calls=0)
def _job_task(
    job_fn: JobFn,
    entry: ManifestEntry,
    settings: Settings,
    budget: ActorProxy[_HubBudget],
    leases: ActorProxy[_NodeLeases] | None,
    token: str,
) -> str:
    """One job on a Ray worker: its hub files downloaded under the run's Hub budget, then the job isolated.

    With ``leases`` (a run that benchmarks), the job converts only outside its node's latency phase,
    in one of its node's conversion slots, and its benchmark waits for that phase (:class:`_NodeLeases`);
    its conversion over, it waits in ``ray.get``, which gives the task's CPU back to Ray, so the node's other jobs
    convert meanwhile. Its checkpoint is downloaded before it asks for a slot: a download waits on the network, not
    in a slot.
    """
    governor = hub_budget.installed()
    if not isinstance(governor, _ClusterGovernor) or governor.actor != budget:
        hub_budget.install(_ClusterGovernor(budget))
    node = ray.get_runtime_context().get_node_id()
    lease = _NodeLease(leases, node, token, settings.threads, entry.gpu) if leases is not None else None
    try:
        if not is_local(entry.source) and not settings.offline:
            try:
                download(entry, settings)
            except ZooConvertError as exc:
                return failure_result(entry, exc.kind, exc.message, stage="fetch").to_json()
        if lease is not None:
            lease.converting()
        return run_isolated(job_fn, entry, settings, lease=lease).to_json()
    finally:
        if lease is not None:
            lease.done()


@dataclass
class _Node:
    """One node's latency phase (see :class:`_NodeLeases`): who converts, who waits to be timed, who is timed."""

    converting: set[str] = field(default_factory=set)
    paused: set[str] = field(default_factory=set)  # conversions stopped for the phase (SIGSTOP), resumed after it
    queue: list[str] = field(default_factory=list)
    lanes: int = 1  # benchmarks the node times at once, each on CPUs of its own
    timing: dict[str, tuple[int, ...]] = field(default_factory=dict)  # token -> the lanes it holds
    phase: bool = False  # conversions held until the queue is timed
    phase_t0: float = 0.0
    first_grant: float | None = None
    phases: int = 0
    phase_s: float = 0.0  # wall time in latency phases, draining included
    drain_s: float = 0.0  # of which: waiting for the conversions running when the phase began to pause or end
    pauses: int = 0  # conversions paused for a phase
    timed_s: float = 0.0  # of which: some benchmark holding the node
    busy_since: float | None = None
    most_converting: int = 0  # conversions at once, paused ones included, at most over the run

    def free_lanes(self) -> list[int]:
        held = {lane for lanes in self.timing.values() for lane in lanes}
        return [lane for lane in range(self.lanes) if lane not in held]


class _NodeLeases:
    """The farm's latency phase: per node, benchmarks with no conversion beside them, each on CPUs of its own.

    A job converts when its node is not in a phase and has a free conversion slot (``convert``: a node's slots are
    its CPUs over a job's threads, a paused conversion keeping its own; Ray counts one CPU a task) and asks to be
    timed when its conversion is over (``bench``). A converting task keeps its CPU in Ray's count (it waits on this
    actor without a Ray call, :class:`_NodeLease`), so Ray starts no task in its place: before that, every
    ``ray.get`` and ``ray.wait`` of a converting task gave its CPU back to Ray for the call, and 3-5 conversion
    processes ran at once on ``make demo``'s 2 CPUs (each target check ~2.5x its CPU time in wall time; the run 4-8 %
    longer), 3 on a 1-CPU node of a cluster. A node enters a phase once no conversion runs there and some
    job waits to be timed, or once ``backlog`` jobs wait: then new conversions wait, and those
    running are paused (``until_phase`` tells their callers, which stop the job's processes and
    ``pause`` until the phase is over): letting them finish made a third of each phase waiting (make demo: 47-55 s of
    139-160; the run no shorter: those conversions used the CPUs). It times the waiting jobs in
    order, as many at once as the node has lanes (its CPUs over the benchmark's threads: the
    caller pins each to its lane's CPUs), a GPU job alone (its GPU targets share one device), and leaves the phase when none is left. Timed one at
    a time, a node of 16 CPUs timed on one of them while 15 idled: the phase grew with the node.
    Jobs whose conversion is over wait inside ``ray.get``, which gives their CPU back to Ray: conversions go on while
    jobs queue for their timing. ``forget`` drops a job however it ended (the driver calls it for every
    finished task: a worker killed mid-benchmark does not hold its node forever).
    """

    def __init__(self, backlog: int, max_lanes: int | None = None) -> None:
        self.backlog = max(1, backlog)
        self.max_lanes = max_lanes
        self.nodes: dict[str, _Node] = {}
        self.changed = asyncio.Condition()

    def _node(self, node: str) -> _Node:
        return self.nodes.setdefault(node, _Node())

    def _update(self) -> None:
        now = time.monotonic()
        for n in self.nodes.values():
            if not n.phase and n.queue and (not (n.converting or n.paused) or len(n.queue) >= self.backlog):
                n.phase, n.phase_t0, n.first_grant = True, now, None
            if n.phase and not n.queue and not n.timing:
                n.phase = False
                n.phases += 1
                n.phase_s += now - n.phase_t0
                n.drain_s += (n.first_grant or now) - n.phase_t0
            n.most_converting = max(n.most_converting, len(n.converting) + len(n.paused))
            if n.timing and n.busy_since is None:
                n.busy_since = now
            elif not n.timing and n.busy_since is not None:
                n.timed_s += now - n.busy_since
                n.busy_since = None
        self.changed.notify_all()

    @ray.method
    async def convert(self, node: str, token: str, slots: int | None) -> None:
        """Return once ``node`` is not in a phase and converts fewer than ``slots`` jobs (None: no count of them)."""
        async with self.changed:
            n = self._node(node)
            await self.changed.wait_for(lambda: not n.phase and (slots is None or len(n.converting) + len(n.paused) < slots))
            n.converting.add(token)
            self._update()

    @ray.method
    async def until_phase(self, node: str, token: str) -> None:
        """Return once ``node`` is in a latency phase while ``token`` converts (or once it no longer converts)."""
        async with self.changed:
            n = self._node(node)
            await self.changed.wait_for(lambda: n.phase or token not in n.converting)

    @ray.method
    async def pause(self, node: str, token: str) -> None:
        """``token``'s conversion is stopped: the phase need not wait for it. Returns when the phase is over (it converts again)."""
        async with self.changed:
            n = self._node(node)
            if token not in n.converting:
                return
            n.converting.discard(token)
            n.paused.add(token)
            n.pauses += 1
            self._update()
            await self.changed.wait_for(lambda: not n.phase or token not in n.paused)
            if token in n.paused:
                n.paused.discard(token)
                n.converting.add(token)
            self._update()

    @ray.method
    async def phase_over(self, node: str) -> None:
        """Return once ``node`` is not in a latency phase."""
        async with self.changed:
            n = self._node(node)
            await self.changed.wait_for(lambda: not n.phase)

    @ray.method
    async def bench(self, node: str, token: str, lanes: int, whole: bool) -> tuple[tuple[int, ...], int]:
        """Wait for this job's turn in its node's phase; the lanes it holds, of how many (all of them: the whole node).

        ``lanes``: the node's CPUs over the benchmark's threads, capped by ``--bench-lanes``.
        """
        async with self.changed:
            n = self._node(node)
            n.lanes = max(1, min(lanes, self.max_lanes or lanes))
            n.converting.discard(token)
            n.queue.append(token)
            self._update()

            def turn() -> bool:
                free = len(n.free_lanes())
                return n.phase and not n.converting and n.queue[0] == token and (free == n.lanes if whole else free > 0)

            await self.changed.wait_for(turn)
            n.queue.pop(0)
            held = tuple(n.free_lanes()) if whole else tuple(n.free_lanes()[:1])
            n.timing[token] = held
            n.first_grant = n.first_grant or time.monotonic()
            self._update()
            return held, n.lanes

    @ray.method
    async def forget(self, token: str) -> None:
        """Drop ``token`` wherever it is: converting, waiting, or holding lanes of its node."""
        async with self.changed:
            for n in self.nodes.values():
                n.converting.discard(token)
                n.paused.discard(token)
                if token in n.queue:
                    n.queue.remove(token)
                n.timing.pop(token, None)
            self._update()

    @ray.method
    async def seconds(self) -> dict[str, dict[str, float]]:
        """Per node: latency phases, their seconds, the draining and the timing in them, its lanes, and the most
        conversions it ran at once."""
        async with self.changed:
            return {node: {"phases": n.phases, "phase_s": n.phase_s, "drain_s": n.drain_s, "timed_s": n.timed_s,
                           "lanes": n.lanes, "pauses": n.pauses, "most_converting": n.most_converting}
                    for node, n in self.nodes.items()}  # fmt: skip


_NodeLeasesActor = ray.remote(num_cpus=0)(_NodeLeases)


class _NodeLease:
    """An :class:`isolation.Lease` on the run's ``_NodeLeases`` actor for one job on one node.

    While its job converts, the task keeps its CPU: it waits on the actor through the reply's future (:func:`_held`),
    never in ``ray.get`` or ``ray.wait``, each of which hands the task's CPU back to Ray for the call, and Ray starts
    another task on the node in its place. The task watching its job asks whether the phase began 20 times a second:
    on a cluster of 1-CPU nodes, 3 conversions ran at once on one of them (tests/test_farm_cluster.py), and a paused
    job's task, waiting for its phase to end in ``ray.get``, let a task start converting there as the phase ended.
    Only a job whose conversion is over hands its CPU back, while it waits to be timed and for its phase to end.
    """

    def __init__(self, actor: ActorProxy[_NodeLeases], node: str, token: str, threads: int, whole: bool) -> None:
        self.actor, self.node, self.token, self.whole = actor, node, token, whole
        self.threads = max(1, threads)
        # Done when the node's next phase begins: the reply's future, asked without a Ray call (it holds the reply).
        self.phase: Future[None] | None = None

    def converting(self) -> None:
        _held(self.actor.convert.remote(self.node, self.token, _conversion_slots(self.node, self.threads)))
        self.phase = self.actor.until_phase.remote(self.node, self.token).future()

    def phase_began(self) -> bool:
        return self.phase is not None and self.phase.done()

    def pause(self) -> None:
        _held(self.actor.pause.remote(self.node, self.token))
        self.phase = self.actor.until_phase.remote(self.node, self.token).future()

    def after_phase(self) -> None:
        ray.get(self.actor.phase_over.remote(self.node))

    def acquire(self) -> tuple[int, ...] | None:
        cpus = _lane_cpus(self.node)
        held, lanes = ray.get(self.actor.bench.remote(self.node, self.token, len(cpus) // self.threads, self.whole))
        if len(held) >= lanes:
            return None  # the node is the job's: nothing to pin
        return tuple(cpu for lane in held for cpu in cpus[lane * self.threads : (lane + 1) * self.threads])

    def release(self) -> None:
        _held(self.actor.forget.remote(self.token))

    def done(self) -> None:
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(self.actor.forget.remote(self.token))


def _held(ref: ray.ObjectRef[_T]) -> _T:
    """``ray.get(ref)`` that keeps the task's CPU: the wait is on the reply's future, not a Ray call (see _NodeLease)."""
    return ref.future().result()


def _conversion_slots(node: str, threads: int) -> int:
    """How many jobs ``node`` may convert at once: its CPUs over a job's threads (Ray counts one CPU a task)."""
    return max(1, len(_lane_cpus(node)) // max(1, threads))


@functools.cache  # a worker serves job after job on one node, whose CPUs do not change: one GCS query per worker
def _lane_cpus(node: str) -> tuple[int, ...]:
    """The CPUs a benchmark on ``node`` may be pinned to: this worker's, no more than Ray counts on the node (a local
    instance's ``num_cpus`` may be fewer than the machine's)."""
    counted = next((int(n["Resources"].get("CPU", 1)) for n in ray.nodes() if n["NodeID"] == node), 1)
    return tuple(sorted(os.sched_getaffinity(0))[: max(1, counted)])


class _HubBudget:
    """The run's Hub request budget; a caller's ``acquire`` returns when its request may go."""

    def __init__(self, limits: HubLimits, history: dict[str, list[float]]) -> None:
        self.budget = Budget(limits, history, time.monotonic())
        self.answered = asyncio.Event()  # set by each release, for the callers waiting for an answered slot

    @ray.method
    async def acquire(self, bucket: str) -> None:
        while True:
            while (wait := self.budget.reserve(bucket, time.monotonic())) is None:
                self.answered.clear()
                # A release wakes us; the window bounds the wait in case the unanswered request never is.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.answered.wait(), self.budget.window)
            await asyncio.sleep(wait)
            if self.budget.clear(bucket, time.monotonic()):
                return
            self.budget.cancel(bucket)

    @ray.method
    async def release(self, bucket: str) -> None:
        self.budget.release(bucket, time.monotonic())
        self.answered.set()

    @ray.method
    async def pause(self, bucket: str, seconds: float) -> None:
        self.budget.pause(bucket, time.monotonic() + seconds)


# ray.remote called, not used as a decorator, and @ray.method on the methods: how Ray's type hints
# see the actor's class and the arguments of its methods' .remote() calls.
_HubBudgetActor = ray.remote(num_cpus=0)(_HubBudget)


class _ClusterGovernor:
    """A :class:`hub_budget.Governor` drawing from the run's ``_HubBudget`` actor."""

    def __init__(self, actor: ActorProxy[_HubBudget]) -> None:
        self.actor = actor

    def acquire(self, bucket: str) -> None:
        ray.get(self.actor.acquire.remote(bucket))

    def release(self, bucket: str) -> None:
        self.actor.release.remote(bucket)

    def pause(self, bucket: str, seconds: float) -> None:
        self.actor.pause.remote(bucket, seconds)


def run_farm(
    manifest_path: str | Path,
    *,
    db_path: str | Path,
    settings: Settings,
    options: FarmOptions = FarmOptions(),
    job_fn: JobFn = convert_one,
    progress: Progress | None = None,
    name: str | None = None,
) -> FarmReport:
    """Convert every job of the manifest that the DB does not answer yet; record each result as it lands.

    ``name`` is the run's unique, human name (``run --name``). One run per database:
    RunLockedError when another run holds it, unless ``options.wait``.
    """
    run_id = _run_id()
    waiting = functools.partial(print, file=sys.stderr)
    # Read and validated before the lock: that touches the manifest and its folders only, never the DB (seconds for
    # 100,000 rows, during which another run may finish). Keying and the DB's answers come under the lock.
    manifest = read_manifest(manifest_path)
    if manifest.file_problems:
        raise ManifestError("; ".join(str(p) for p in manifest.file_problems))
    with _terminated_as_interrupt(), run_lock(db_path, run_id, wait=options.wait, waiting=waiting):
        with hub_budget.governing(LocalGovernor(options.hub_limits)):
            return _run_farm(manifest, run_id, db_path, settings, options, job_fn, progress, name)


class Terminated(KeyboardInterrupt):
    """The driver got SIGTERM (``kill``, a scheduler ending the job): the run ends as ``interrupted``, as on Ctrl-C."""


@contextlib.contextmanager
def _terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the driver while a run is under way (main thread only: where signals land)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminate(signum: int, frame: object) -> None:
    raise Terminated(f"terminated by {signal.Signals(signum).name}")


def _check_out_dir(out: Path) -> None:
    """``--out`` is a folder this run can make and write in; else OutputDirError, before any job meets it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".zoo-convert-probe-") as probe:
            probe.write(b"probe")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        raise OutputDirError(f"--out {out}: cannot write artifacts there: {exc.strerror or exc}") from exc


def _run_farm(
    manifest: Manifest,
    run_id: str,
    db_path: str | Path,
    settings: Settings,
    options: FarmOptions,
    job_fn: JobFn,
    progress: Progress | None,
    name: str | None,
) -> FarmReport:
    t0 = time.monotonic()
    store = ResultStore(db_path)
    if name is not None:
        store.check_run_name(name)  # before Ray starts: a taken name stops the run at once
    store.abandon_runs()  # we hold the run lock: a run still "running" lost its driver
    done: set[str] = set() if options.force else store.terminal_keys(include_failed=not options.retry_failed)
    plan = make_plan(manifest, settings, done, store.last_durations(), store.timeouts(), latest=store.latest_keys())
    if plan.jobs:
        _check_out_dir(Path(settings.out_dir))  # before Ray starts: no job should meet an unusable --out
    settings = job_settings(settings, [job.entry for job in plan.jobs] + list(plan.unresolved))
    report = FarmReport(
        run_id=run_id, name=name, total=plan.total, skipped=plan.skipped, unresolved=len(plan.unresolved),
        skipped_by_status=Counter(latest_job_statuses(store, list(plan.skipped_keys))),
    )
    progress = progress or Progress()
    if manifest.duplicates_summary:
        progress.note(manifest.duplicates_summary)  # once: never a job, nor a result
    progress.start(report, len(plan.jobs) + len(plan.invalid))
    needs_ray = bool(plan.jobs) or (bool(plan.unresolved) and options.max_attempts > 1)
    started_ray = needs_ray and not ray.is_initialized()
    if started_ray and options.address is None:
        _prestart_fork_server(preload_for(settings))
    if started_ray:
        progress.starting_ray(options.address or os.environ.get("RAY_ADDRESS"))
        _init_ray(options)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _terminate)  # ray.init put its own in (sys.exit): ours again
    report.ray_started = needs_ray
    resources = ray.cluster_resources() if needs_ray else {}
    store.start_run(
        report.run_id,
        manifest=str(manifest.path.resolve()),
        manifest_hash=manifest.sha256,
        versions=toolchain_versions(),
        resources=resources,
        settings={**asdict(settings), "farm": asdict(options)},
        name=name,
    )
    status = "failed"
    try:
        invalid = [(bad.key, _invalid_result(bad), 1) for bad in plan.invalid]
        _record(store, report, progress, invalid[:MAX_LISTED])
        if invalid[MAX_LISTED:]:  # each is recorded; a line each would bury the run's own lines
            _record(store, report, progress, invalid[MAX_LISTED:], quiet=True)
            progress.note(f"... and {len(invalid) - MAX_LISTED} more invalid rows recorded as manifest_error"
                          " (`zoo-convert manifest validate` lists them all)")  # fmt: skip
        if needs_ray:
            budget = _cluster_budget(options.hub_limits, report.run_id)
            leases = _node_leases(resources, report.run_id, options.bench_lanes) if settings.benchmark and plan.jobs else None
            try:
                driver = _Driver(store, report, progress, settings, options, job_fn, resources, budget, leases)
                driver.run(plan.jobs, plan.unresolved, done)
                if leases is not None:
                    report.latency = ray.get(leases.seconds.remote())
            finally:
                if leases is not None:
                    ray.kill(leases)  # type: ignore[arg-type]
                # Ray's hints type a handle as ActorProxy (the handle or the class, so that methods
                # show their arguments); ray.kill's own annotation accepts only the handle it always is.
                ray.kill(budget)  # type: ignore[arg-type]
        status = "stopped" if report.stopped else "completed"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        store.finish_run(report.run_id, status=status)
        if started_ray:
            ray.shutdown()
        report.seconds = time.monotonic() - t0
        progress.finish(report)
    return report


class _Driver:
    """Submits jobs, keeps a bounded number in flight, records or resubmits what comes back."""

    def __init__(
        self,
        store: ResultStore,
        report: FarmReport,
        progress: Progress,
        settings: Settings,
        options: FarmOptions,
        job_fn: JobFn,
        resources: dict[str, float],
        budget: ActorProxy[_HubBudget],
        leases: ActorProxy[_NodeLeases] | None = None,
    ) -> None:
        self.store, self.report, self.progress = store, report, progress
        self.settings, self.options, self.job_fn, self.budget = settings, options, job_fn, budget
        self.leases = leases
        self.gpus = resources.get("GPU", 0)
        cpus = int(resources.get("CPU", 1))
        # Jobs waiting for their node's latency phase are in flight too, holding no CPU: room for them.
        self.max_in_flight = options.max_in_flight or max(2, 2 * cpus) + (BENCH_BACKLOG_PER_CPU * cpus if leases else 0)
        self.tokens: dict[ray.ObjectRef[str], str] = {}
        self.node_memory = max((n["Resources"].get("memory", 0) for n in ray.nodes() if n["Alive"]), default=0)
        self.in_flight: dict[ray.ObjectRef[str], tuple[Job, int]] = {}
        self.waiting: list[tuple[float, int, Job, int]] = []  # (ready at, tiebreak, job, attempt): backoff heap
        self._seq = itertools.count()
        # Hub ids to resolve again: (entries, the attempt it will be, when), and the try under way.
        self.unresolved: tuple[list[ManifestEntry], int, float] | None = None
        self.resolving: Future[tuple[list[Job], list[ManifestEntry]]] | None = None
        self._resolver = ThreadPoolExecutor(1, thread_name_prefix="resolve")  # starts its thread on first use
        self.n_jobs = 0
        # (kind, jobs, faults): the machine's fault the latest outcomes all met, the jobs that met it, and the faults
        # themselves (one per outcome, but one for all the tasks of a node that died); the latest such result per job
        self.fault_streak: tuple[FailureKind, set[str], set[str]] | None = None
        self.last_fault: dict[str, ConversionResult] = {}
        self.stop_for: tuple[FailureKind, ConversionResult] | None = None
        self.raylet_died: str | None = None  # why, once a task said the driver's own raylet died

    def run(self, jobs: tuple[Job, ...], unresolved: tuple[ManifestEntry, ...] = (), done: set[str] | None = None) -> None:
        """Run every job to one terminal result; resolve ``unresolved`` entries on the way and run them too."""
        queue = [(job, 1) for job in reversed(jobs)]  # pop() from the end keeps the plan's priority order
        if unresolved and self.options.max_attempts > 1:  # planning's try was the first
            self.unresolved = (list(unresolved), 2, time.monotonic() + self._backoff(2))
        self.n_jobs = len(jobs) + len(unresolved)
        while queue or self.waiting or self.in_flight or self.unresolved or self.resolving:
            now = time.monotonic()
            while self.waiting and self.waiting[0][0] <= now:
                _, _, job, attempt = heapq.heappop(self.waiting)
                queue.append((job, attempt))
            queue += self._resolved(done or set())
            while queue and len(self.in_flight) < self.max_in_flight:
                self._submit(*queue.pop())
            if not self.in_flight:  # only timers to wait for, or a resolution under way
                time.sleep(0.05 if self.resolving else self._until_next_timer())
                continue
            timeout = min(1.0, max(0.0, self.waiting[0][0] - now)) if self.waiting else 1.0
            ready, rest = ray.wait(list(self.in_flight), num_returns=1, timeout=timeout)
            if ready and rest:  # take everything else that is done too: one DB transaction for all of it
                ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            finished, lost = [], []
            for ref in ready:
                job, attempt = self.in_flight.pop(ref)
                token = self.tokens.pop(ref, None)
                if self.leases is not None and token is not None:  # a job that died holding its node lets go of it
                    self.leases.forget.remote(token)
                result, fault = self._collect(ref, job)
                if self.raylet_died is not None and result.failure_kind == FailureKind.WORKER_LOST.value:
                    lost.append(job)  # not the model's answer, nor worth a retry here: left for the next run
                    continue
                finished += self._done(job, attempt, result, fault)
            _record(self.store, self.report, self.progress, finished)
            if self.raylet_died is not None:
                self._abandon(len(queue) + len(lost), self.raylet_died)
                break
            self.progress.tick(self.report, len(self.in_flight))
            if self.stop_for is not None and (queue or self.waiting or self.in_flight):
                self._stop(queue, *self.stop_for)
                break
        self._resolver.shutdown()

    def _stop(self, queue: list[tuple[Job, int]], kind: FailureKind, result: ConversionResult) -> None:
        """Stop early: a job waiting for another try is recorded with the machine's fault it met (not terminal:
        the next run redoes it); those running are cancelled, those never started left for the next run."""
        for ref in self.in_flight:
            with contextlib.suppress(ray.exceptions.RayError):  # a lost node's tasks cannot be reached to cancel
                ray.cancel(ref, force=True)
        tried = [(job, attempt) for _, _, job, attempt in sorted(self.waiting, key=lambda w: w[1])]
        tried += [(job, attempt) for job, attempt in queue if attempt > 1]
        _record(self.store, self.report, self.progress,
                [(job.key, self.last_fault[job.key], attempt - 1) for job, attempt in tried])  # fmt: skip
        left = len(self.in_flight) + sum(attempt == 1 for _, attempt in queue)
        left += len(self.unresolved[0]) if self.unresolved else 0
        self.in_flight.clear()
        self.waiting.clear()
        self.unresolved = None
        first = (result.message or "").splitlines()
        self.report.stopped = (
            f"stopped early: {len(self.fault_streak[1]) if self.fault_streak else 0} jobs in a row met {kind.value}"
            f" ({first[0] if first else 'no message'}): the machine's fault, not the models'; {left} jobs left"
            " for the next run"
        )

    def _abandon(self, unstarted: int, why: str) -> None:
        """Stop at once, recording nothing more: the driver's raylet died, so no job can run or be retried from here.
        Every job not answered yet (``unstarted`` of them out of flight) has no result, and the next run redoes it."""
        left = unstarted + len(self.in_flight) + len(self.waiting) + (len(self.unresolved[0]) if self.unresolved else 0)
        self.in_flight.clear()  # their tasks died with the raylet
        self.waiting.clear()
        self.unresolved = None
        self.report.stopped = (f"stopped: this machine's Ray raylet died ({why}): the machine's fault, not the models';"
                               f" {left} jobs left for the next run")  # fmt: skip

    def _streak(self, job: Job, kind: FailureKind | None, result: ConversionResult, fault: str | None = None) -> bool:
        """Whether every job of late met the same fault of the machine: at least STOP_AFTER_JOBS of them in a row
        (or all there are), over at least as many faults as one job gets tries; any other outcome starts the count
        again. Each outcome is a fault of its own but those that name the same ``fault`` (the tasks of one node that
        died): a node lost with three jobs on it is one fault, which their tries on other nodes get over, not three
        in a row (in CI, counted one each, one lost node stopped the run)."""
        if kind not in MACHINE_FAULTS or kind is None:
            self.fault_streak = None
            return False
        if self.fault_streak is None or self.fault_streak[0] != kind:
            self.fault_streak = (kind, set(), set())
        _, jobs, faults = self.fault_streak
        jobs.add(job.key)
        faults.add(fault if fault is not None else f"outcome {next(self._seq)}")
        self.last_fault[job.key] = result
        return len(jobs) >= min(STOP_AFTER_JOBS, self.n_jobs) and len(faults) >= self.options.max_attempts

    def _submit(self, job: Job, attempt: int) -> None:
        if job.entry.gpu and not self.gpus:
            result = failure_result(job.entry, FailureKind.GPU_UNAVAILABLE, "the job needs a GPU and no node offers one")
            _record(self.store, self.report, self.progress, [(job.key, result, attempt)])
            return
        opts: dict[str, Any] = {"num_cpus": 1, "num_gpus": 1 if job.entry.gpu else 0, "name": f"convert {job.entry.source}"}
        if job.memory_bytes:
            # a reservation no node can hold would wait forever; the child's own limit still applies
            opts["memory"] = min(job.memory_bytes, self.node_memory) if self.node_memory else job.memory_bytes
        token = uuid.uuid4().hex
        ref = _job_task.options(**opts).remote(self.job_fn, job.entry, self.settings, self.budget, self.leases, token)
        self.in_flight[ref] = (job, attempt)
        self.tokens[ref] = token

    def _resolved(self, done: set[str]) -> list[tuple[Job, int]]:
        """Jobs of hub ids resolved on a later try; starts the next try when its backoff is over."""
        new: list[tuple[Job, int]] = []
        if self.resolving is not None and self.resolving.done():
            jobs, still = self.resolving.result()
            attempt = self.unresolved[1] if self.unresolved else self.options.max_attempts
            self.resolving, self.unresolved = None, None
            for job in jobs:
                if job.key in done:
                    self.report.skipped += 1
                else:
                    new.append((job, 1))
            self.progress.resolved(len(new), still, attempt, final=attempt >= self.options.max_attempts)
            self.report.unresolved = len(still)
            if still and attempt < self.options.max_attempts:
                self.unresolved = (still, attempt + 1, time.monotonic() + self._backoff(attempt + 1))
        if self.unresolved and self.resolving is None and time.monotonic() >= self.unresolved[2]:
            self.resolving = self._resolver.submit(keyed_jobs, self.unresolved[0], self.settings)
            # self.unresolved stays until the try ends: it holds the attempt number
        return new

    def _backoff(self, attempt: int) -> float:
        """Wait before attempt ``attempt`` (2, 3, ...) of a job or a resolution."""
        return min(MAX_BACKOFF_S, self.options.backoff_s * 2.0 ** (attempt - 2))

    def _until_next_timer(self) -> float:
        times = [self.waiting[0][0]] if self.waiting else []
        if self.unresolved:
            times.append(self.unresolved[2])
        return max(0.0, min([1.0, *(t - time.monotonic() for t in times)]))

    def _collect(self, ref: ray.ObjectRef[str], job: Job) -> tuple[ConversionResult, str | None]:
        """The job's result, or a failure standing in for a task Ray could not finish, and the fault it shares with
        other jobs' (``dead node <id>``: the task's node died) or None."""
        try:
            return ConversionResult.from_json(ray.get(ref)), None
        except ray.exceptions.OutOfMemoryError as exc:
            killed = f"Ray's memory monitor killed the worker: {first_line(exc)}"
            return failure_result(job.entry, FailureKind.OOM, killed), None
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, UnsafeForkServerError):
                raise exc.cause from None  # the node is unsafe to run on, not the model: stop the run
            # our task wrapper raised: a bug of ours, not worth retrying
            return failure_result(job.entry, FailureKind.INTERNAL, f"farm task failed: {first_line(exc)}"), None
        except ray.exceptions.LocalRayletDiedError as exc:
            # This machine's raylet is gone (its DashboardAgent killed takes it along): no task can run from here
            # any more, so retrying only spends the backoff; the run stops (``raylet_died``) and records nothing.
            self.raylet_died = first_line(exc)
            return failure_result(job.entry, FailureKind.WORKER_LOST, first_line(exc)), None
        except ray.exceptions.NodeDiedError as exc:
            node = _DEAD_NODE.search(str(exc))
            lost = failure_result(job.entry, FailureKind.WORKER_LOST, first_line(exc))
            return lost, f"dead node {node.group(1)}" if node else None
        except ray.exceptions.RayError as exc:
            return failure_result(job.entry, FailureKind.WORKER_LOST, first_line(exc)), None

    def _done(self, job: Job, attempt: int, result: ConversionResult, fault: str | None = None
              ) -> list[tuple[str, ConversionResult, int]]:  # fmt: skip
        """The result to record, or none when a transient failure goes back in the queue."""
        kind = _kind(result)
        self.stop_for = (kind, result) if self._streak(job, kind, result, fault) and kind is not None else None
        if kind is not None and kind.transient and attempt < self.options.max_attempts:
            delay = self._backoff(attempt + 1)
            heapq.heappush(self.waiting, (time.monotonic() + delay, next(self._seq), job, attempt + 1))
            self.report.retries += 1
            self.progress.retry(job, result, attempt, delay)
            return []
        return [(job.key, result, attempt)]


def _record(
    store: ResultStore,
    report: FarmReport,
    progress: Progress,
    finished: list[tuple[str, ConversionResult, int]],
    *,
    quiet: bool = False,
) -> None:
    """Record finished jobs in one transaction, then count and show them (``quiet``: count only)."""
    batch = [(key, replace(result, attempts=attempts)) for key, result, attempts in finished]
    store.record_many(report.run_id, batch)
    for _, result in batch:
        report.count(result)
        if not quiet:
            progress.result(report, result)


def _invalid_result(bad: InvalidRow) -> ConversionResult:
    source = bad.values.get("source")
    entry = ManifestEntry(source=str(source) if source else f"<manifest row {bad.problem.row}>", row=bad.problem.row)
    return failure_result(entry, FailureKind.MANIFEST_ERROR, bad.problem.reason, stage="manifest")


def _node_leases(resources: dict[str, float], run_id: str, lanes: int | None) -> ActorProxy[_NodeLeases]:
    """The run's latency phases (:class:`_NodeLeases`), on the driver's node: each node times ``backlog`` jobs at most
    per phase, four per CPU of the largest node, at most ``lanes`` at once."""
    cpus = max((int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n["Alive"]), default=int(resources.get("CPU", 1)))
    return _NodeLeasesActor.options(name=f"zoo-convert-latency-{run_id}", scheduling_strategy=_on_driver_node()).remote(
        BENCH_BACKLOG_PER_CPU * max(1, cpus), lanes
    )


def _on_driver_node() -> NodeAffinitySchedulingStrategy:
    """The driver's node, never another: a soft affinity put one of the run's actors on a worker node of a local
    cluster (tests/test_farm_cluster.py, 3 runs in 5), and losing that worker lost every job of the run with it."""
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def _cluster_budget(limits: HubLimits, run_id: str) -> ActorProxy[_HubBudget]:
    """The run's Hub budget as an actor the driver and every worker draw from, continuing what planning spent."""
    local = hub_budget.installed()
    history = local.history() if isinstance(local, LocalGovernor) else {}
    # On the driver's node, which the run cannot outlive; restarted (with a fresh budget) if it dies anyway.
    actor = _HubBudgetActor.options(
        name=f"zoo-convert-hub-budget-{run_id}", scheduling_strategy=_on_driver_node(), max_restarts=-1,
        max_task_retries=-1,
    ).remote(limits, history)
    hub_budget.install(_ClusterGovernor(actor))
    return actor


def job_settings(settings: Settings, entries: list[ManifestEntry]) -> Settings:
    """The settings the run's jobs get: the fork server warms the torch exporter only where a row names it.

    Rows of exporter ``auto`` do not count: they resolve per model type, which only optimum's
    registry (seconds to import in the driver) can say, and most resolve to optimum; one that
    takes the torch exporter pays its first-call cost itself, as every torch job did before.
    """
    return replace(settings, warm_torch_exporter=any(entry.exporter == "torch" for entry in entries))


def _prestart_fork_server(preload: str) -> None:
    """Start this machine's fork server now, so its warm-up runs while ``ray.init`` starts the local instance.

    The local workers find it at its socket; the driver's connection keeps it up for the run.
    A failure here only costs time: the first worker to need the server tries again. An
    unsafe socket folder (:class:`UnsafeForkServerError`) is not caught: it stops the run.
    """
    try:
        fork_server(preload=preload)
    except (OSError, RuntimeError) as exc:
        print(f"zoo_convert: could not prestart the fork server ({exc}); the workers will", file=sys.stderr)


def _init_ray(options: FarmOptions) -> None:
    """Connect to the given cluster, or start a local instance (``num_cpus`` only applies to that)."""
    kwargs: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False, "logging_level": logging.WARNING}
    if options.address is None and options.num_cpus is not None:
        kwargs["num_cpus"] = options.num_cpus
    # Ray turns token authentication on for every new local instance and says so on each run; only
    # that notice is dropped (a warning that authentication is off still comes through).
    logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(_not_token_auth_enabled)
    # Without an address ray.init() would join whatever cluster `ray start` left registered on this
    # machine; the farm's default is its own local instance (RAY_ADDRESS, as `ray job submit` sets it, still counts).
    ray.init(address=options.address or os.environ.get("RAY_ADDRESS") or "local", **kwargs)


def _not_token_auth_enabled(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def _kind(result: ConversionResult) -> FailureKind | None:
    try:
        return FailureKind(result.failure_kind) if result.failure_kind else None
    except ValueError:
        return FailureKind.INTERNAL


def _where_seconds_go(report: FarmReport) -> str:
    """The run's wall time and its latency phases: ``seconds   180.2 s: latency phase 41.0 s (23 %) in 14 phases ...``."""
    nodes = report.latency.values()
    phase = sum(n["phase_s"] for n in nodes) / max(1, len(nodes))  # each node's phases hold that node only
    timed = sum(n["timed_s"] for n in nodes) / max(1, len(nodes))
    drain = sum(n["drain_s"] for n in nodes) / max(1, len(nodes))
    phases = sum(int(n["phases"]) for n in nodes)
    pauses = sum(int(n["pauses"]) for n in nodes)
    lanes = sorted({int(n["lanes"]) for n in nodes}) or [1]
    most = max((int(n["most_converting"]) for n in nodes), default=0)
    share = 100.0 * phase / report.seconds if report.seconds > 0 else 0.0
    per_node = " per node" if len(report.latency) > 1 else ""
    at_once = "one at a time" if lanes == [1] else f"{'-'.join(map(str, lanes))} at once"
    return (f"seconds    {report.seconds:.1f} s: converting {report.seconds - phase:.1f} s, latency phase {phase:.1f} s"
            f"{per_node} ({share:.0f} %: timing {timed:.1f} s {at_once}, pausing or draining conversions {drain:.1f} s ({pauses} paused),"
            f" {phases} phases on {len(report.latency)} node{'s' if len(report.latency) > 1 else ''};"
            f" at most {most} conversions at once{' on a node' if len(report.latency) > 1 else ''})")


def _run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:6]


class Progress:
    """Farm progress: a live line on a terminal, one log line per job otherwise, a summary at the end."""

    def __init__(self, stream: IO[str] | None = None, *, live: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.t0 = time.monotonic()
        self.todo = 0
        self.running = 0

    def start(self, report: FarmReport, todo: int) -> None:
        """Say what the run will do."""
        self.t0, self.todo = time.monotonic(), todo
        if todo == 0 and not report.unresolved:
            self._line(f"nothing to do: all {report.total} jobs already have a result (use --force or --retry-failed)")
        else:
            self._line(f"run {report.label}: {todo} to do, {report.skipped} of {report.total} already done"
                       + (f", {report.unresolved} hub ids to resolve again (the Hub did not answer)"
                          if report.unresolved else ""))

    def note(self, text: str) -> None:
        """One line about the run's input (duplicate rows)."""
        self._line(text)

    def resolved(self, new_jobs: int, still: list[ManifestEntry], attempt: int, *, final: bool) -> None:
        """A later try at resolving hub ids: how many became jobs, and what is still unresolved."""
        self.todo += new_jobs
        if not still:
            self._line(f"resolved the remaining hub ids on attempt {attempt}: {new_jobs} more to do")
            return
        names = ", ".join(e.source for e in still[:5]) + (f" and {len(still) - 5} more" if len(still) > 5 else "")
        self._line(f"{len(still)} hub ids still unresolved after attempt {attempt} ({names}); "
                   + ("left for the next run" if final else "trying again"))

    def starting_ray(self, address: str | None) -> None:
        """Ray is starting (a local instance: 10-20 s before the first job runs)."""
        local = address in (None, "", "local")
        self._line("starting Ray (a local instance takes 10-20 s) ..." if local else f"connecting to Ray at {address} ...")

    def result(self, report: FarmReport, result: ConversionResult) -> None:
        """One job landed in the DB: on a terminal, a failed job gets its own line above the live one."""
        if self.live:
            if not result.passed and result.status != INCONCLUSIVE:
                model, kind, stage, message = FailureLine(result.source, None, result.failure_kind or "unknown",
                                                          result.stage or "job", result.message).cells()
                self._line(f"failed  {model}  {kind}  {stage}  {message}"[:300])
            self._bar(report)
            return
        opset = result.opset_requested if result.opset_requested is not None else "default"
        # a model converts on fp32; a variant that failed beside it makes it partial, named in the log
        what = ("partial" if result.partial else result.status) if result.passed else f"{result.status} {result.failure_kind}"
        what = INCONCLUSIVE if result.status == INCONCLUSIVE else what
        broken = [f"{v.variant} {v.failure_kind}" for v in result.variants if v.status != PASSED and result.passed]
        self._line(
            f"[{report.recorded}/{self.todo}] {what:<24} {printable(result.source, FIELD_LIMIT)} ({result.exporter}, opset {opset})"
            f" attempts={result.attempts}" + (f"  [{', '.join(broken)}]" if broken else "")
        )

    def retry(self, job: Job, result: ConversionResult, attempt: int, delay: float) -> None:
        """A transient failure; the job goes back in the queue."""
        if not self.live:
            self._line(f"retry {job.entry.source} after {result.failure_kind} (attempt {attempt}) in {delay:.1f} s")

    def tick(self, report: FarmReport, running: int) -> None:
        """Refresh the live line."""
        self.running = running
        if self.live:
            self._bar(report)

    def finish(self, report: FarmReport) -> None:
        """Print the summary: models converted, variants verified, failure kinds, then the failures by name."""
        if self.live:
            self.stream.write("\n")
        if report.stopped:
            self._line(report.stopped)
        if not report.recorded:
            return
        converted = report.by_status.get(PASSED, 0)
        self._line(f"run {report.label}: {report.recorded} recorded in {report.seconds:.1f} s"
                   f" ({report.skipped} skipped, {report.retries} retries"
                   + (f", {report.unresolved} hub ids unresolved" if report.unresolved else "") + ")")  # fmt: skip
        if report.skipped:  # the whole manifest: this run's jobs and those answered before
            before = report.skipped_by_status.get(PASSED, 0)
            self._line(f"  converted  {converted + before} of {report.recorded + report.skipped} models (fp32 verified):"
                       f" {converted} of {report.recorded} this run, {before} of {report.skipped} done before;"
                       f" {report.partial} partial (a variant failed)")
        else:
            self._line(f"  converted  {converted} of {report.recorded} models (fp32 verified), {report.partial} partial"
                       " (a variant failed)")
        self._line(f"  variants   {report.variants_verified} of {report.variants} verified")
        if report.latency:
            self._line("  " + _where_seconds_go(report))
        if report.by_status.get(INCONCLUSIVE):
            self._line(f"inconclusive ({report.by_status[INCONCLUSIVE]}, neither converted nor failed):")
            for line in report.inconclusive:
                self._line(f"  {line.source}  {line.message}")
        if not report.n_failures:
            return
        self._line("  failures   " + ", ".join(f"{k} {n}" for k, n in sorted(report.by_kind.items())))
        redone = {k.value for k in FailureKind if not k.terminal}
        machine = {k: n for k, n in sorted(report.by_kind.items()) if k in redone}
        if machine:
            self._line("  machine    " + ", ".join(f"{k} {n}" for k, n in machine.items())
                       + ": the machine's fault, not the models'; the next run redoes them")  # fmt: skip
        rows = [line.cells() for line in report.failures]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        self._line(f"failed ({report.n_failures}):")
        for row in rows:
            self._line("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[3])
        if report.n_failures > len(rows):
            self._line(f"  ... and {report.n_failures - len(rows)} more: zoo-convert db query \"SELECT source, variant,"
                       f" failure_kind, stage, message FROM results WHERE run_id = '{report.run_id}'"
                       " AND status = 'failed'\"")

    def _bar(self, report: FarmReport) -> None:
        done, elapsed = report.recorded, time.monotonic() - self.t0
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (self.todo - done) / rate if rate > 0 else float("nan")
        failed = done - report.by_status.get(PASSED, 0) - report.by_status.get(INCONCLUSIVE, 0)
        eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta == eta else "--:--:--"
        self.stream.write(
            f"\r{done}/{self.todo} done  {failed} failed  {self.running} running"
            f"  {rate * 60:.1f}/min  ETA {eta_text} "
        )
        self.stream.flush()

    def _line(self, text: str) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")  # clear the bar, or a shorter line leaves its tail behind
        # names and messages are anyone's: a folder named with ESC or a newline must not forge a line
        self.stream.write(printable(text) + "\n")
        self.stream.flush()

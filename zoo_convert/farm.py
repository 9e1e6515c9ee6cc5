"""The farm driver: manifest -> plan -> Ray tasks -> one DuckDB row set per job.

The only module that imports ray. The driver reads and validates the manifest,
keys every job (:mod:`zoo_convert.plan`), drops the keys the results DB already
answers and, when nothing is left, stops there without starting Ray. Otherwise
it submits one Ray task per job (highest priority first, a bounded number in
flight), consumes results as they finish (``ray.wait``) and records each in its
own transaction: the driver is the database's only writer, and a driver killed
mid-run loses nothing that was recorded, so rerunning the command finishes the rest.
One run per database at a time: a run holds the database's run lock
(:mod:`zoo_convert.store.lock`) throughout, and marks runs left ``running`` by a
killed driver ``abandoned``.

Ray never retries anything itself (``max_retries=0``, ``retry_exceptions=False``:
it would retry an OOM-killed task forever). The driver resubmits jobs whose
failure is transient (:attr:`FailureKind.transient`: worker or node lost, OOM,
network errors while fetching) with exponential backoff, up to ``max_attempts``,
and records how many attempts it took. Inside a task, the job runs in a warm
forked child (:mod:`zoo_convert.isolation`) so hangs, crashes and OOMs are results.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import ray
import ray.exceptions

from .errors import FailureKind, ManifestError, UnsafeForkServerError
from .isolation import JobFn, failure_result, fork_server, run_isolated
from .manifest import read_manifest
from .pipeline import convert_one
from .plan import InvalidRow, Job, make_plan
from .records import PASSED, ConversionResult, ManifestEntry, Settings
from .store.db import ResultStore
from .store.lock import run_lock
from .versions import toolchain_versions

MAX_BACKOFF_S = 60.0


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
        wait: when another run holds the database, wait for it instead of stopping.
    """

    address: str | None = None
    num_cpus: int | None = None
    max_in_flight: int | None = None
    force: bool = False
    retry_failed: bool = False
    max_attempts: int = 3
    backoff_s: float = 2.0
    wait: bool = False


@dataclass
class FarmReport:
    """What a run did.

    Attributes:
        run_id: the ``runs`` row of this run.
        total: jobs and invalid rows in the manifest.
        skipped: those already answered in the DB.
        recorded: results written by this run.
        ray_started: whether the run needed Ray at all.
        by_status / by_kind: counts of recorded results.
        retries: resubmissions after transient failures.
        seconds: wall time of the run.
    """

    run_id: str
    total: int = 0
    skipped: int = 0
    recorded: int = 0
    ray_started: bool = False
    by_status: Counter = field(default_factory=Counter)
    by_kind: Counter = field(default_factory=Counter)
    retries: int = 0
    seconds: float = 0.0


@ray.remote(max_retries=0, retry_exceptions=False, max_calls=0)
def _job_task(job_fn: JobFn, entry: ManifestEntry, settings: Settings) -> str:
    """One job on a Ray worker: run it isolated, return the result as JSON."""
    return run_isolated(job_fn, entry, settings).to_json()


def run_farm(
    manifest_path: str | Path,
    *,
    db_path: str | Path,
    settings: Settings,
    options: FarmOptions = FarmOptions(),
    job_fn: JobFn = convert_one,
    progress: Progress | None = None,
) -> FarmReport:
    """Convert every job of the manifest that the DB does not answer yet; record each result as it lands.

    One run per database: RunLockedError when another run holds it, unless ``options.wait``.
    """
    run_id = _run_id()
    waiting = functools.partial(print, file=sys.stderr)
    with run_lock(db_path, run_id, wait=options.wait, waiting=waiting):
        return _run_farm(manifest_path, run_id, db_path, settings, options, job_fn, progress)


def _run_farm(
    manifest_path: str | Path,
    run_id: str,
    db_path: str | Path,
    settings: Settings,
    options: FarmOptions,
    job_fn: JobFn,
    progress: Progress | None,
) -> FarmReport:
    t0 = time.monotonic()
    manifest = read_manifest(manifest_path)
    if manifest.file_problems:
        raise ManifestError("; ".join(str(p) for p in manifest.file_problems))
    store = ResultStore(db_path)
    store.abandon_runs()  # we hold the run lock: a run still "running" lost its driver
    done: set[str] = set() if options.force else store.terminal_keys(include_failed=not options.retry_failed)
    plan = make_plan(manifest, settings, done, store.last_durations(), store.timeouts())
    report = FarmReport(run_id=run_id, total=plan.total, skipped=plan.skipped)
    progress = progress or Progress()
    progress.start(report, len(plan.jobs) + len(plan.invalid))
    started_ray = bool(plan.jobs) and not ray.is_initialized()
    if started_ray and options.address is None:
        _prestart_fork_server()
    if started_ray:
        _init_ray(options)
    report.ray_started = bool(plan.jobs)
    resources = ray.cluster_resources() if plan.jobs else {}
    store.start_run(
        report.run_id,
        manifest=str(Path(manifest_path).resolve()),
        manifest_hash=manifest.sha256,
        versions=toolchain_versions(),
        resources=resources,
        settings={**asdict(settings), "farm": asdict(options)},
    )
    status = "failed"
    try:
        _record(store, report, progress, [(bad.key, _invalid_result(bad), 1) for bad in plan.invalid])
        if plan.jobs:
            _Driver(store, report, progress, settings, options, job_fn, resources).run(plan.jobs)
        status = "completed"
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
    ) -> None:
        self.store, self.report, self.progress = store, report, progress
        self.settings, self.options, self.job_fn = settings, options, job_fn
        self.gpus = resources.get("GPU", 0)
        self.max_in_flight = options.max_in_flight or max(2, 2 * int(resources.get("CPU", 1)))
        self.node_memory = max((n["Resources"].get("memory", 0) for n in ray.nodes() if n["Alive"]), default=0)
        self.in_flight: dict[ray.ObjectRef, tuple[Job, int]] = {}
        self.waiting: list[tuple[float, int, Job, int]] = []  # (ready at, tiebreak, job, attempt): backoff heap
        self._seq = itertools.count()

    def run(self, jobs: tuple[Job, ...]) -> None:
        """Run every job to one terminal result."""
        queue = [(job, 1) for job in reversed(jobs)]  # pop() from the end keeps the plan's priority order
        while queue or self.waiting or self.in_flight:
            now = time.monotonic()
            while self.waiting and self.waiting[0][0] <= now:
                _, _, job, attempt = heapq.heappop(self.waiting)
                queue.append((job, attempt))
            while queue and len(self.in_flight) < self.max_in_flight:
                self._submit(*queue.pop())
            if not self.in_flight:
                time.sleep(max(0.0, min(1.0, self.waiting[0][0] - time.monotonic())) if self.waiting else 0)
                continue
            timeout = min(1.0, max(0.0, self.waiting[0][0] - now)) if self.waiting else 1.0
            ready, rest = ray.wait(list(self.in_flight), num_returns=1, timeout=timeout)
            if ready and rest:  # take everything else that is done too: one DB transaction for all of it
                ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            finished = []
            for ref in ready:
                job, attempt = self.in_flight.pop(ref)
                finished += self._done(job, attempt, self._collect(ref, job))
            _record(self.store, self.report, self.progress, finished)
            self.progress.tick(self.report, len(self.in_flight))

    def _submit(self, job: Job, attempt: int) -> None:
        if job.entry.gpu and not self.gpus:
            result = failure_result(job.entry, FailureKind.GPU_UNAVAILABLE, "the job needs a GPU and no node offers one")
            _record(self.store, self.report, self.progress, [(job.key, result, attempt)])
            return
        opts: dict[str, Any] = {"num_cpus": 1, "num_gpus": 1 if job.entry.gpu else 0, "name": f"convert {job.entry.source}"}
        if job.memory_bytes:
            # a reservation no node can hold would wait forever; the child's own limit still applies
            opts["memory"] = min(job.memory_bytes, self.node_memory) if self.node_memory else job.memory_bytes
        ref = _job_task.options(**opts).remote(self.job_fn, job.entry, self.settings)
        self.in_flight[ref] = (job, attempt)

    def _collect(self, ref: ray.ObjectRef, job: Job) -> ConversionResult:
        """The job's result, or a failure standing in for a task Ray could not finish."""
        try:
            return ConversionResult.from_json(ray.get(ref))
        except ray.exceptions.OutOfMemoryError as exc:
            return failure_result(job.entry, FailureKind.OOM, f"Ray's memory monitor killed the worker: {_first(exc)}")
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, UnsafeForkServerError):
                raise exc.cause from None  # the node is unsafe to run on, not the model: stop the run
            # our task wrapper raised: a bug of ours, not worth retrying
            return failure_result(job.entry, FailureKind.INTERNAL, f"farm task failed: {_first(exc)}")
        except ray.exceptions.RayError as exc:
            return failure_result(job.entry, FailureKind.WORKER_LOST, f"{type(exc).__name__}: {_first(exc)}")

    def _done(self, job: Job, attempt: int, result: ConversionResult) -> list[tuple[str, ConversionResult, int]]:
        """The result to record, or none when a transient failure goes back in the queue."""
        kind = _kind(result)
        if kind is not None and kind.transient and attempt < self.options.max_attempts:
            delay = min(MAX_BACKOFF_S, self.options.backoff_s * 2 ** (attempt - 1))
            heapq.heappush(self.waiting, (time.monotonic() + delay, next(self._seq), job, attempt + 1))
            self.report.retries += 1
            self.progress.retry(job, result, attempt, delay)
            return []
        return [(job.key, result, attempt)]


def _record(
    store: ResultStore, report: FarmReport, progress: Progress, finished: list[tuple[str, ConversionResult, int]]
) -> None:
    """Record finished jobs in one transaction, then count and show them."""
    batch = [(key, replace(result, attempts=attempts)) for key, result, attempts in finished]
    store.record_many(report.run_id, batch)
    for _, result in batch:
        report.recorded += 1
        report.by_status[result.status] += 1
        if result.failure_kind:
            report.by_kind[result.failure_kind] += 1
        progress.result(report, result)


def _invalid_result(bad: InvalidRow) -> ConversionResult:
    source = bad.values.get("source")
    entry = ManifestEntry(source=str(source) if source else f"<manifest row {bad.problem.row}>", row=bad.problem.row)
    return failure_result(entry, FailureKind.MANIFEST_ERROR, bad.problem.reason, stage="manifest")


def _prestart_fork_server() -> None:
    """Start this machine's fork server now, so its warm-up runs while ``ray.init`` starts the local instance.

    The local workers find it at its socket; the driver's connection keeps it up for the run.
    A failure here only costs time: the first worker to need the server tries again. An
    unsafe socket folder (:class:`UnsafeForkServerError`) is not caught: it stops the run.
    """
    try:
        fork_server()
    except (OSError, RuntimeError) as exc:
        print(f"zoo_convert: could not prestart the fork server ({exc}); the workers will", file=sys.stderr)


def _init_ray(options: FarmOptions) -> None:
    """Connect to the given cluster, or start a local instance (``num_cpus`` only applies to that)."""
    kwargs: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False}
    if options.address is None and options.num_cpus is not None:
        kwargs["num_cpus"] = options.num_cpus
    ray.init(address=options.address, **kwargs)


def _kind(result: ConversionResult) -> FailureKind | None:
    try:
        return FailureKind(result.failure_kind) if result.failure_kind else None
    except ValueError:
        return FailureKind.INTERNAL


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
        if todo == 0:
            self._line(f"nothing to do: all {report.total} jobs already have a result (use --force or --retry-failed)")
        else:
            self._line(f"run {report.run_id}: {todo} to do, {report.skipped} of {report.total} already done")

    def result(self, report: FarmReport, result: ConversionResult) -> None:
        """One job landed in the DB."""
        if self.live:
            self._bar(report)
            return
        opset = result.opset_requested if result.opset_requested is not None else "default"
        what = result.status if result.status == PASSED else f"{result.status} {result.failure_kind}"
        # a model passes on fp32; a variant that failed beside it is still worth a glance in the log
        broken = [f"{v.variant} {v.failure_kind}" for v in result.variants if v.status != PASSED and result.passed]
        self._line(
            f"[{report.recorded}/{self.todo}] {what:<24} {result.source} ({result.exporter}, opset {opset})"
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
        """Print the summary table."""
        if self.live:
            self.stream.write("\n")
        if not report.recorded:
            return
        rows = [("passed", report.by_status.get(PASSED, 0))] + sorted(report.by_kind.items())
        width = max(len(k) for k, _ in rows)
        self._line(f"run {report.run_id}: {report.recorded} recorded in {report.seconds:.1f} s"
                   f" ({report.skipped} skipped, {report.retries} retries)")  # fmt: skip
        for name, n in rows:
            self._line(f"  {name:<{width}}  {n:>6}")

    def _bar(self, report: FarmReport) -> None:
        done, elapsed = report.recorded, time.monotonic() - self.t0
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (self.todo - done) / rate if rate > 0 else float("nan")
        failed = done - report.by_status.get(PASSED, 0)
        eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta == eta else "--:--:--"
        self.stream.write(
            f"\r{done}/{self.todo} done  {failed} failed  {self.running} running"
            f"  {rate * 60:.1f}/min  ETA {eta_text} "
        )
        self.stream.flush()

    def _line(self, text: str) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")  # clear the bar, or a shorter line leaves its tail behind
        self.stream.write(text + "\n")
        self.stream.flush()

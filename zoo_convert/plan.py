"""Planning: manifest entries -> keyed jobs, minus those the results DB already answers.

A job's cache key hashes the resolved checkpoint (hub commit sha or ``sha256:``
of a local folder), the entry's conversion settings, the farm settings that
change what is built, verified or measured, and the toolchain versions. The
same key means the same answer, so a nightly rerun of an unchanged manifest
has nothing to do. The hard timeout is no part of the key (it bounds the work,
it does not change the answer): a ``timeout`` answer stands only until a run
allows the job longer than it had.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from .errors import ManifestError
from .manifest import Manifest, row_key
from .records import ManifestEntry, Settings
from .stages.fetch import is_local, resolve_revision
from .versions import toolchain_versions

GIB = 1024**3
# Weights are held as torch tensors, ONNX initializers and ORT buffers at once, on top of ~1 GiB of runtime.
_MEMORY_PER_WEIGHT_BYTE = 4
_BASE_MEMORY = 1 * GIB
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
_RESOLVE_THREADS = 16


@dataclass(frozen=True)
class Job:
    """One conversion to run.

    Attributes:
        key: the cache key (see the module docstring).
        entry: what to convert.
        resolved_revision: what the key was computed from (``unresolved:...`` when the hub could not say).
        memory_bytes: memory to reserve on the node; None reserves nothing.
    """

    key: str
    entry: ManifestEntry
    resolved_revision: str
    memory_bytes: int | None = None


@dataclass(frozen=True)
class InvalidRow:
    """A manifest row that cannot run, recorded as a ``manifest_error`` result.

    Attributes:
        key: stable key from the row's number and content.
        problem: why it is invalid.
        values: the row as read.
    """

    key: str
    problem: ManifestError
    values: dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """What a run will do.

    Attributes:
        jobs: jobs to run, in submission order (higher priority first, then longest expected first, then row order).
        invalid: invalid rows still to record.
        skipped: jobs and invalid rows whose key already has a terminal result.
        total: all jobs and invalid rows of the manifest.
    """

    jobs: tuple[Job, ...]
    invalid: tuple[InvalidRow, ...]
    skipped: int
    total: int

    @property
    def empty(self) -> bool:
        """Nothing left to run or record."""
        return not self.jobs and not self.invalid


def make_plan(
    manifest: Manifest,
    settings: Settings,
    done: set[str] | frozenset[str] = frozenset(),
    durations: Mapping[tuple[str, str | None, int | None], float] | None = None,
    timeouts: Mapping[str, float | None] | None = None,
) -> Plan:
    """Key every job and invalid row of the manifest and drop those in ``done``.

    A job in ``done`` whose answer is a timeout (``timeouts``: key -> the timeout it ran
    under) is kept when it may now run longer: the timeout is not in the key, so changing
    it leaves every other answer cached, and a job that timed out is redone only by a run
    that gives it more time.

    Within a priority, jobs go longest first by ``durations`` (seconds the same source, exporter
    and opset took last time): a night should not end waiting on one big model submitted last.
    Jobs never seen before go first of all, as their length is unknown; ties keep manifest order.
    """
    jobs = keyed_jobs(manifest.entries, settings)
    invalid = [
        InvalidRow(row_key(p.row, manifest.bad_rows[p.row]), p, manifest.bad_rows[p.row])
        for p in manifest.problems
        if p.row is not None
    ]
    durations = durations or {}

    def order(job: Job) -> tuple[float, float, int]:
        last = durations.get((job.entry.source, job.entry.exporter, job.entry.opset))
        return (-job.entry.priority, -(last if last is not None else math.inf), job.entry.row or 0)

    timeouts = timeouts or {}

    def answered(job: Job) -> bool:
        ran_under = timeouts.get(job.key)
        longer = ran_under is not None and (job.entry.timeout_s or settings.timeout_s) > ran_under
        return job.key in done and not longer

    todo = sorted((j for j in jobs if not answered(j)), key=order)
    bad = [r for r in invalid if r.key not in done]
    total = len(jobs) + len(invalid)
    return Plan(tuple(todo), tuple(bad), total - len(todo) - len(bad), total)


def keyed_jobs(entries: tuple[ManifestEntry, ...] | list[ManifestEntry], settings: Settings) -> list[Job]:
    """Resolve each distinct checkpoint once (in parallel: hub calls wait on the network) and key every entry."""
    checkpoints = sorted({(e.source, e.revision) for e in entries}, key=str)
    with ThreadPoolExecutor(_RESOLVE_THREADS) as pool:
        resolved = dict(zip(checkpoints, pool.map(lambda c: _resolve(c[0], c[1], settings), checkpoints)))
    versions = toolchain_versions()
    return [
        Job(
            key=job_key(e, resolved[(e.source, e.revision)], settings, versions),
            entry=e,
            resolved_revision=resolved[(e.source, e.revision)],
            memory_bytes=estimate_memory(e),
        )
        for e in entries
    ]


def job_key(entry: ManifestEntry, resolved_revision: str, settings: Settings, versions: dict[str, str]) -> str:
    """Hash of what decides a job's answer: checkpoint, conversion settings, toolchain."""
    blob = {
        "source": entry.source,
        "resolved_revision": resolved_revision,
        "task": entry.task,
        "opset": entry.opset,
        "exporter": entry.exporter,
        "variants": sorted(entry.variants),
        "gpu": entry.gpu,
        "allow_remote_code": entry.allow_remote_code,
        "allow_pickle": entry.allow_pickle,
        "tolerances": {k: asdict(v) for k, v in sorted(settings.tolerances.items())},
        "verify_shapes": settings.verify_shapes,
        "providers": settings.providers,
        "external_data_threshold": settings.external_data_threshold,
        # Always present: a --no-benchmark result has no latencies, so a default run must not reuse it.
        "optimize": settings.optimize,
        "benchmark": settings.benchmark,
        "versions": versions,
    }
    text = json.dumps(blob, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def estimate_memory(entry: ManifestEntry) -> int | None:
    """Bytes to reserve: ``memory_gb`` when given, else from a local folder's weights; None for hub ids."""
    if entry.memory_gb is not None:
        return int(entry.memory_gb * GIB)
    if not is_local(entry.source) or not os.path.isdir(entry.source):
        return None
    weights = 0
    for root, _, files in os.walk(entry.source):
        for f in files:
            if f.endswith(_WEIGHT_SUFFIXES):
                with contextlib.suppress(OSError):  # a dangling link: the job's fetch reports it
                    weights += os.path.getsize(os.path.join(root, f))
    return _BASE_MEMORY + _MEMORY_PER_WEIGHT_BYTE * weights


def _resolve(source: str, revision: str | None, settings: Settings) -> str:
    """The resolved revision, or a stand-in when it cannot be had (the job's fetch meets the error and records it).

    Whatever goes wrong with one checkpoint (an unreadable file, a bug of ours) must not stop the plan.
    """
    try:
        return resolve_revision(ManifestEntry(source=source, revision=revision), settings)
    except Exception:  # noqa: BLE001 - one row's problem, recorded by its own job
        return f"unresolved:{revision or 'default'}"

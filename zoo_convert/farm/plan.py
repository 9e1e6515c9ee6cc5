"""Planning: manifest entries -> keyed jobs, minus those the results DB already answers.

A job's cache key hashes the resolved checkpoint (hub commit sha or ``sha256:``
of a local folder), the entry's conversion settings, the farm settings that
change what is built, verified or measured, and the toolchain versions. The
same key means the same answer, so a nightly rerun of an unchanged manifest
has nothing to do. The hard timeout is no part of the key (it bounds the work,
it does not change the answer): a ``timeout`` answer stands only until a run
allows the job longer than it had.

Resolving a hub id costs one API request (``model_info``: the commit and its
file list, which the job then receives on its entry), or less: the ids of an
owner that has several in the manifest are read from the owner's model listing,
a page of models per request. Every request is bounded by
``Settings.hub_timeout_s`` and paced by the process's Hub budget
(:mod:`zoo_convert.farm.hub_budget`). A hub id whose resolution fails transiently
(timeout, 5xx, connection error) is not a model's failure: it comes back in
``Plan.unresolved`` for the farm to try again during the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..errors import ManifestError, ZooConvertError
from ..manifest import Manifest, row_key
from ..records import DEFAULT_OPTIMIZATION, HubSnapshot, ManifestEntry, Settings
from ..sources import is_local
from ..stages.fetch import hub_snapshot, list_snapshots, resolve_revision
from ..node import toolchain_versions

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
        unresolved: entries whose hub id could not be resolved for now (transient errors); no key yet.
        skipped_keys: the keys of the skipped jobs and rows.
    """

    jobs: tuple[Job, ...]
    invalid: tuple[InvalidRow, ...]
    skipped: int
    total: int
    unresolved: tuple[ManifestEntry, ...] = ()
    skipped_keys: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """Nothing left to run, record or resolve."""
        return not self.jobs and not self.invalid and not self.unresolved


def make_plan(
    manifest: Manifest,
    settings: Settings,
    done: set[str] | frozenset[str] = frozenset(),
    durations: Mapping[tuple[str, str | None, int | None], float] | None = None,
    timeouts: Mapping[str, float | None] | None = None,
    latest: Mapping[tuple[str, str | None, str, int | None], tuple[str, str | None]] | None = None,
) -> Plan:
    """Key every job and invalid row of the manifest and drop those in ``done``.

    A job in ``done`` whose answer is a timeout (``timeouts``: key -> the timeout it ran
    under) is kept when it may now run longer: the timeout is not in the key, so changing
    it leaves every other answer cached, and a job that timed out is redone only by a run
    that gives it more time.

    Within a priority, jobs go longest first by ``durations`` (seconds the same source, exporter
    and opset took last time): a night should not end waiting on one big model submitted last.
    Jobs never seen before go first of all, as their length is unknown; ties keep manifest order.

    ``latest`` (model -> its latest job's key and the checkpoint version it found, as
    ``latest_results`` sees it) brings back an answered job whose model's latest job is none of
    this manifest's and found another version: a local folder (or a branch) gone back to a
    version already answered, after a run recorded another one. Skipped, ``latest_results``
    would keep showing the other version; run again, it shows what is there now.
    """
    jobs, unresolved = keyed_jobs(manifest.entries, settings)
    # Rows the manifest tells apart may still be one job: a hub id with no revision and with "main" resolve to
    # one commit, so one key. The first row runs it; the run must never record one job twice and abort.
    firsts: dict[str, Job] = {}
    for job in jobs:
        firsts.setdefault(job.key, job)
    jobs = list(firsts.values())
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

    latest = latest or {}
    current = {job.key for job in jobs}

    def answered(job: Job) -> bool:
        ran_under = timeouts.get(job.key)
        longer = ran_under is not None and (job.entry.timeout_s or settings.timeout_s) > ran_under
        e = job.entry
        shown = latest.get((e.source, e.revision, e.exporter, e.opset))
        # the latest answer is another version's: the checkpoint came back to this one since
        moved_away = shown is not None and shown[0] not in current and shown[1] != job.resolved_revision
        return job.key in done and not longer and not moved_away

    todo = sorted((j for j in jobs if not answered(j)), key=order)
    bad = [r for r in invalid if r.key not in done]
    total = len(jobs) + len(invalid) + len(unresolved)
    skipped = tuple([j.key for j in jobs if answered(j)] + [r.key for r in invalid if r.key in done])
    return Plan(tuple(todo), tuple(bad), total - len(todo) - len(bad) - len(unresolved), total, tuple(unresolved), skipped)


def keyed_jobs(
    entries: tuple[ManifestEntry, ...] | list[ManifestEntry], settings: Settings
) -> tuple[list[Job], list[ManifestEntry]]:
    """Resolve each distinct checkpoint once and key every entry; entries that could not be resolved for now come apart.

    A hub id's job carries what resolution learned (:class:`HubSnapshot`) on its entry.
    """
    resolved = _resolve_all(sorted({(e.source, e.revision) for e in entries}, key=str), settings)
    versions = toolchain_versions()
    jobs, unresolved = [], []
    for e in entries:
        found = resolved[(e.source, e.revision)]
        if found is None:
            unresolved.append(e)
            continue
        revision = found.sha if isinstance(found, HubSnapshot) else found
        jobs.append(
            Job(
                key=job_key(e, revision, settings, versions),
                entry=replace(e, snapshot=found) if isinstance(found, HubSnapshot) else e,
                resolved_revision=revision,
                memory_bytes=estimate_memory(e),
            )
        )
    return jobs, unresolved


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
        "verify_long": settings.verify_long,
        "verify_generation": settings.verify_generation,
        # Only when some are fixed: keys made before shapes could be fixed stay the same.
        **({"shapes": dict(sorted(settings.shapes.items()))} if settings.shapes else {}),
        "providers": settings.providers,
        "external_data_threshold": settings.external_data_threshold,
        # Always present: a --no-benchmark result has no latencies, so a default run must not reuse it.
        "optimize": settings.optimize,
        "benchmark": settings.benchmark,
        # Only when not the default O2, which every key made before levels existed was made at.
        **({"optimization": level} if (level := entry.optimize or settings.optimization) != DEFAULT_OPTIMIZATION else {}),
        "versions": versions,
        # Only when chosen: keys made before targets existed (and default runs) stay the same.
        **({"targets": list(t)} if (t := entry.targets if entry.targets is not None else settings.targets) is not None else {}),
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


def _resolve_all(
    checkpoints: list[tuple[str, str | None]], settings: Settings
) -> dict[tuple[str, str | None], str | HubSnapshot | None]:
    """Each checkpoint's resolution: listings first, then one call each (in parallel: they wait on the network)."""
    owners: dict[str, set[str]] = {}
    for source, revision in checkpoints:
        if revision is None and "/" in source and not settings.offline and not is_local(source):
            owners.setdefault(source.split("/")[0], set()).add(source)
    listed: dict[tuple[str, str | None], str | HubSnapshot | None] = {}
    for owner, ids in sorted(owners.items()):
        if len(ids) >= 2:  # a listing page costs what one model_info does
            listed.update(((s, None), snap) for s, snap in list_snapshots(owner, ids, settings).items())
    rest = [c for c in checkpoints if c not in listed]
    with ThreadPoolExecutor(_RESOLVE_THREADS) as pool:
        return {**listed, **dict(zip(rest, pool.map(lambda c: _resolve(c[0], c[1], settings), rest)))}


def _resolve(source: str, revision: str | None, settings: Settings) -> str | HubSnapshot | None:
    """A local folder's hash or a hub id's snapshot; a stand-in key when the hub says no or the folder cannot be
    read (the job's fetch meets the error and records it); None when the hub could not answer for now."""
    entry = ManifestEntry(source=source, revision=revision)
    try:
        if is_local(source) or settings.offline:
            return resolve_revision(entry, settings)
        return hub_snapshot(entry, settings)
    except ZooConvertError as exc:
        if exc.kind.transient:
            return None
        return f"unresolved:{revision or 'default'}"
    except Exception:  # noqa: BLE001 - one checkpoint's problem (a bug of ours too) never stops the plan: its job records it
        return f"unresolved:{revision or 'default'}"

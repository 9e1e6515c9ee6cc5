"""The node a job runs on, as its record states it: the toolchain's versions and the CPUs its cgroup gives.

**Versions** (:func:`toolchain_versions`) are part of every result and of every job's cache key.

**The CPU** (:func:`cpu_model`): named with its int8 instruction sets beside every latency; where ONNX Runtime
saturates int8 products (:func:`int8_saturates`), verify checks an int8 graph on its uint8 twin.

**CPUs.** In a container the host's own figures mislead. ``os.cpu_count()`` and the first line of
``/proc/stat`` count every CPU of the host, while the container runs on a cpuset (``docker
--cpuset-cpus``, Kubernetes' static CPU manager) or under a CPU quota (``docker --cpus``, a pod's
CPU limit). Read from the host, the benchmark's noise rule (CPUs other processes kept busy against
the CPUs a measurement left free) gave a 1-thread measurement in a 4-CPU pod on a 64-CPU host 63
CPUs to leave free, and counted other tenants' work on CPUs the farm never runs on as interference;
under a quota, ``convert`` opened a thread per CPU of the host.
:func:`cpus` reads the cgroup once per process (cgroup v2, else v1; the host's figures where there is
none): the cpuset's CPUs, the quota in CPUs, and the cgroup's CPU-usage counter. :func:`busy_s` is the
busy time the node's CPUs have spent: over the cpuset's CPUs (``/proc/stat``'s per-CPU lines), or,
where a quota shares the CPUs with processes outside the container, the container's own usage.
"""

from __future__ import annotations

import functools
import math
import os
import platform
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import zoo_convert

# timm builds the timm models: a new release may change an architecture, so it is part of the cache key too.
PACKAGES = ("torch", "timm", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime", "onnxruntime-gpu")


@functools.cache
def toolchain_versions() -> dict[str, str]:
    """Installed versions, read from package metadata so the driver needs no torch import."""
    found = {"zoo_convert": zoo_convert.__version__}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


PROC_STAT = Path("/proc/stat")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class NodeCpus:
    """The CPUs a cgroup allows.

    Attributes:
        ids: the CPUs its cpuset holds (every CPU of the machine without one).
        quota: CPUs' worth of time it may use per period (None: no quota).
        usage: its cumulative CPU-usage file (``cpu.stat`` in v2, ``cpuacct.usage`` in v1), where there is one.
        host: how many CPUs the machine has.
    """

    ids: tuple[int, ...]
    quota: float | None = None
    usage: Path | None = None
    host: int = 0

    @property
    def count(self) -> int:
        """How many CPUs' worth the node has: its cpuset's, or its quota's where that is fewer."""
        n = len(self.ids) or 1
        return max(1, min(n, math.ceil(self.quota))) if self.quota else n

    @property
    def shared(self) -> bool:
        """Whether processes outside the cgroup run on its CPUs (a quota without a cpuset of its own size)."""
        return self.quota is not None and self.quota < len(self.ids)


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """A kernel CPU list (``0-3,8,10-11``) as its CPU ids."""
    ids: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        ids.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(ids))


@functools.cache  # a process's cgroup does not change under it
def cpus() -> NodeCpus:
    """This process's cgroup's CPUs (:class:`NodeCpus`)."""
    return read_cpus()


def read_cpus(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> NodeCpus:
    """:func:`cpus` from the given files (the kernel's by default): v2 where ``root`` is the unified hierarchy."""
    host = os.cpu_count() or 1
    everything = tuple(range(host))
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return NodeCpus(everything, host=host)
    paths = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path.lstrip("/")
    if (root / "cgroup.controllers").exists():  # v2: one hierarchy
        own = _own_dir(root, paths.get("", ""))
        ids = _cpuset(own, root, "cpuset.cpus.effective")
        quota = _quota_v2(own, root)
        usage = own / "cpu.stat" if (own / "cpu.stat").exists() else None
    else:  # v1: a hierarchy per controller
        cpuset = _own_dir(root / "cpuset", paths.get("cpuset", ""))
        cpu = _own_dir(root / "cpu", paths.get("cpu", ""))
        acct = _own_dir(root / "cpuacct", paths.get("cpuacct", ""))
        ids = _cpuset(cpuset, root / "cpuset", "cpuset.effective_cpus") or _cpuset(cpuset, root / "cpuset", "cpuset.cpus")
        quota = _quota_v1(cpu, root / "cpu")
        usage = acct / "cpuacct.usage" if (acct / "cpuacct.usage").exists() else None
    return NodeCpus(ids or everything, quota, usage, host)


def _own_dir(mount: Path, path: str) -> Path:
    """The process's cgroup folder under ``mount``; the mount's root where the path is the host's (no cgroup namespace)."""
    own = mount / path
    return own if path and own.is_dir() else mount


def _ancestors(own: Path, mount: Path) -> list[Path]:
    """``own`` and its parents up to ``mount``: a limit set on a parent holds for its children."""
    found = [own]
    while found[-1] != mount and mount in found[-1].parents:
        found.append(found[-1].parent)
    return found


def _cpuset(own: Path, mount: Path, name: str) -> tuple[int, ...]:
    for folder in _ancestors(own, mount):
        try:
            ids = parse_cpu_list((folder / name).read_text())
        except (OSError, ValueError):
            continue
        if ids:
            return ids
    return ()


def _quota_v2(own: Path, mount: Path) -> float | None:
    quotas = []
    for folder in _ancestors(own, mount):
        try:
            limit, period = (folder / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        if limit != "max" and float(period) > 0:
            quotas.append(float(limit) / float(period))
    return min(quotas) if quotas else None


def _quota_v1(own: Path, mount: Path) -> float | None:
    quotas = []
    for folder in _ancestors(own, mount):
        try:
            limit = float((folder / "cpu.cfs_quota_us").read_text())
            period = float((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        if limit > 0 and period > 0:  # -1: no quota
            quotas.append(limit / period)
    return min(quotas) if quotas else None


def busy_s(node: NodeCpus | None = None) -> float | None:
    """CPU-seconds the node's CPUs have spent busy (not idle, not waiting on I/O) since boot; None where unknown.

    Over the cpuset's CPUs, from ``/proc/stat``; where a quota shares those CPUs with processes
    outside the cgroup (:attr:`NodeCpus.shared`), the cgroup's own usage instead, so another
    tenant's work is not counted as the farm's.
    """
    node = node or cpus()
    if node.shared and node.usage is not None:
        return _cgroup_usage_s(node.usage)
    try:
        lines = PROC_STAT.read_text().splitlines()
    except OSError:
        return None
    wanted = None if len(node.ids) >= node.host else {f"cpu{i}" for i in node.ids}
    total = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or (name != "cpu" if wanted is None else name not in wanted):
            continue
        try:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        except ValueError:
            return None
        total += user + nice + system + irq + softirq + steal
    return total / TICK


def _cgroup_usage_s(path: Path) -> float | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    if path.name == "cpu.stat":  # v2: "usage_usec N" among others
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        return None
    return int(text) / 1e9  # v1 cpuacct.usage: nanoseconds


def one_blas_thread(env: MutableMapping[str, str]) -> None:
    """Give a process that has not imported numpy yet (``env``: its environment) one OpenBLAS thread, unless set.

    numpy's OpenBLAS runs a large call (verify's dot products, a feature extractor's matmul) on a
    thread per CPU, and the extra threads then spin-wait for the next call on CPUs the job's PyTorch
    and ONNX Runtime, or the node's other jobs, are using: 5.8 % of `make demo`'s CPU time (perf, 2
    cores; docs/how-a-job-runs.md). OpenBLAS reads this once, when numpy is imported: the CLI sets it
    before anything imports numpy, and the fork server starts with it. A library import of zoo_convert
    leaves the caller's environment as it is.
    """
    env.setdefault("OPENBLAS_NUM_THREADS", "1")


def no_triton() -> None:
    """Keep triton out of a process that has not imported torch yet: the CLI's and the fork server's, never a library's.

    transformers imports ``torch._dynamo`` (its masking code), and dynamo imports triton wherever it is
    installed, which with torch's CUDA wheels is every node, CPU nodes too: 72 MB of each job's resident memory
    (all-MiniLM-L6-v2's ``convert``: the export's peak 1.23 -> 1.16 GB, the AVX2 EPYC of docs/benchmarks.md)
    for torch.compile's GPU kernels, which nothing a job runs uses: torch.onnx's exporters, eager PyTorch and
    ONNX Runtime. With ``None`` in ``sys.modules`` an ``import triton`` fails and ``find_spec`` finds nothing:
    torch and transformers take it as not installed. Once torch is imported it is too late, and left alone.
    """
    if "torch" not in sys.modules and "triton" not in sys.modules:
        sys.modules["triton"] = None  # type: ignore[assignment]  # the import system's own "not importable" mark


def no_diffusers() -> None:
    """Keep diffusers out of a process that exports one model, which is no diffusers pipeline (``convert``'s).

    optimum's exporter imports diffusers wherever it is installed (its task table and a Flux patch), which a
    zoo_convert node always has for the pipelines it converts: about 1 s of the export's imports (diffusers'
    import checks alone 0.44 s; vit-base's fp32 ``convert`` 19.3 / 19.2 / 17.7 -> 17.9 / 18.6 / 16.9 s, the AVX2
    EPYC of docs/benchmarks.md). With ``None`` in ``sys.modules`` optimum finds it not installed, a
    configuration it supports, and exports every other library as before. A process that goes on to export
    something else (a farm's fork server, a test) must not call it; once diffusers is imported it is left alone.
    """
    if "diffusers" not in sys.modules:
        sys.modules["diffusers"] = None  # type: ignore[assignment]  # as no_triton: "not importable"


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (where the OS has one), no more than the cgroup's quota."""
    mine = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpus().quota
    return max(1, min(mine, math.ceil(quota))) if quota else mine


@functools.cache  # one machine's: read once per process, not once per job
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """The CPU's model name and flags (/proc/cpuinfo's first processor); empty where there is none."""
    name, flags = "", frozenset[str]()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = frozenset(value.split())
    except OSError:
        pass
    return name, flags


# The x86 instructions with which ONNX Runtime's uint8 x int8 products add into 32 bits (MLAS: VPDPBUSD, AMX tiles).
INT8_EXACT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_model() -> str:
    """The CPU's model name and the int8 instruction sets ORT can use: said next to every latency."""
    name, flags = _cpuinfo()
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    has = [flag for flag in ("avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16") if flag in flags]
    return f"{name} ({', '.join(has) if has else 'no VNNI/AMX'})"


def int8_saturates() -> bool:
    """Whether ONNX Runtime's uint8 x int8 products saturate here: x86 without VNNI or AMX.

    There MLAS adds two products into an int16 (VPMADDUBSW) that an 8-bit weight can overflow. ARM's dot
    products and VNNI add into 32 bits. An x86 CPU whose flags cannot be read counts as saturating.
    """
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False
    return not set(INT8_EXACT_FLAGS) & _cpuinfo()[1]

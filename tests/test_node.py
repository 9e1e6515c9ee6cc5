"""The node's CPUs as its cgroup gives them, and the busy time counted over those CPUs only."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zoo_convert import node
from zoo_convert.node import NodeCpus, parse_cpu_list, read_cpus

pytestmark = pytest.mark.alone  # pins processes to CPUs and reads what runs on them


def test_a_kernel_cpu_list_reads_as_its_cpus() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpu_list("5") == (5,) and parse_cpu_list("\n") == ()


def _v2(tmp: Path, *, cpus: str, cpu_max: str, parent_max: str = "max 100000") -> tuple[Path, Path]:
    """A cgroup v2 hierarchy as the kernel lays it out, with the process in ``farm/node``."""
    root = tmp / "sys"
    own = root / "farm" / "node"
    own.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "farm" / "cpu.max").write_text(parent_max + "\n")
    (own / "cpuset.cpus.effective").write_text(cpus + "\n")
    (own / "cpu.max").write_text(cpu_max + "\n")
    (own / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    proc = tmp / "cgroup"
    proc.write_text("0::/farm/node\n")
    return proc, root


def test_a_v2_cgroup_gives_its_cpuset_and_its_tightest_quota(tmp_path: Path) -> None:
    proc, root = _v2(tmp_path, cpus="2-5", cpu_max="max 100000", parent_max="250000 100000")
    found = read_cpus(proc, root)
    assert found.ids == (2, 3, 4, 5) and found.quota == 2.5 and found.count == 3  # a parent's limit holds
    assert found.shared  # 2.5 CPUs' worth on 4 CPUs: others run beside it
    assert found.usage is not None and node._cgroup_usage_s(found.usage) == 2.5

    proc, root = _v2(tmp_path / "pinned", cpus="0-3", cpu_max="max 100000")
    pinned = read_cpus(proc, root)
    assert (pinned.ids, pinned.quota, pinned.count, pinned.shared) == ((0, 1, 2, 3), None, 4, False)


def test_a_v1_cgroup_gives_its_cpuset_quota_and_usage(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    for controller, files in {
        "cpuset": {"cpuset.effective_cpus": "0,2\n"},
        "cpu": {"cpu.cfs_quota_us": "150000\n", "cpu.cfs_period_us": "100000\n"},
        "cpuacct": {"cpuacct.usage": "3000000000\n"},
    }.items():
        folder = root / controller / "docker" / "abc"
        folder.mkdir(parents=True)
        for name, text in files.items():
            (folder / name).write_text(text)
    proc = tmp_path / "cgroup"
    proc.write_text("5:cpuacct:/docker/abc\n4:cpu:/docker/abc\n3:cpuset:/docker/abc\n1:name=systemd:/\n")
    found = read_cpus(proc, root)
    assert (found.ids, found.quota, found.count) == ((0, 2), 1.5, 2)
    assert found.usage is not None and node._cgroup_usage_s(found.usage) == 3.0


def test_no_cgroup_is_the_whole_machine(tmp_path: Path) -> None:
    found = read_cpus(tmp_path / "missing", tmp_path)
    assert found.ids == tuple(range(os.cpu_count() or 1)) and found.quota is None and not found.shared


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2 or not os.path.exists("/proc/stat"),
    reason="needs two CPUs and Linux's /proc/stat",
)
def test_busy_time_counts_the_node_cpus_only() -> None:
    """A neighbour spinning on a CPU outside a node's cpuset is no interference to it (the host's line counted it)."""
    pinned = max(os.sched_getaffinity(0))
    host = os.cpu_count() or 1
    nodes = [NodeCpus((c,), host=host) for c in range(host)] + [NodeCpus(tuple(range(host)), host=host)]
    spin = f"import os, time\nos.sched_setaffinity(0, {{{pinned}}})\nt = time.time()\nwhile time.time() - t < 1.5: pass\n"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.3)  # the child has started and pinned itself
        t0, before = time.perf_counter(), [node.busy_s(n) for n in nodes]
        time.sleep(0.8)
        after, wall = [node.busy_s(n) for n in nodes], time.perf_counter() - t0
    finally:
        child.wait()
    per_s = [(b - a) / wall for a, b in zip(before, after, strict=True) if a is not None and b is not None]
    assert len(per_s) == host + 1
    *each, whole = per_s
    assert each[pinned] > 0.7, per_s  # the spinner's CPU is busy, whatever else runs on the machine
    assert all(v <= 1.05 for v in each), per_s  # one CPU is at most one CPU busy
    assert abs(sum(each) - whole) < 0.1 * host, per_s  # the CPUs apart add up to the host's count


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="no triton installed (torch's CPU wheel)")
def test_the_cli_keeps_triton_out_and_a_library_import_or_a_late_call_leaves_it() -> None:
    """transformers' import of torch._dynamo loads triton, 72 MB of a job's memory for nothing a job runs
    (node.no_triton); a user's own process keeps it, and a process that imported torch first is left as it is."""
    code = (
        "import contextlib, io, sys\n"
        "import zoo_convert.cli\n"
        "if sys.argv[1] == 'late':\n"
        "    import torch\n"
        "if sys.argv[1] in ('cli', 'late'):\n"
        "    sys.argv[1:] = ['--help']\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "        zoo_convert.cli.main()\n"
        "import transformers.masking_utils\n"  # the import that brings torch._dynamo, and dynamo triton
        "from torch.utils._triton import has_triton_package\n"
        "print(sys.modules.get('triton') is not None, has_triton_package())"
    )
    ran = {how: subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, check=True).stdout.split()
           for how in ("cli", "library", "late")}  # fmt: skip
    assert ran["cli"] == ["False", "False"], ran
    assert ran["library"] == ["True", "True"] and ran["late"] == ["True", "True"], ran


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: OpenBLAS runs one thread anyway")
def test_the_cli_runs_numpy_blas_on_one_thread_and_a_library_import_leaves_the_environment_alone() -> None:
    """OpenBLAS's extra threads spin after each call on CPUs the jobs use (node.one_blas_thread); a user's own
    processes keep their setting."""
    code = (
        "import contextlib, io, os, sys\n"
        "import zoo_convert.cli\n"
        "if sys.argv[1] == 'cli':\n"
        "    sys.argv[1:] = ['--help']\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "        zoo_convert.cli.main()  # the console script, as `zoo-convert --help` runs it\n"
        "import numpy as np\n"
        "from threadpoolctl import threadpool_info\n"
        "np.ones(1 << 17) @ np.ones(1 << 17)\n"
        "print(os.environ.get('OPENBLAS_NUM_THREADS'), *[p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas'])"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    ran = {how: subprocess.run([sys.executable, "-c", code, how], env=env, capture_output=True, text=True, check=True).stdout.split()
           for how in ("cli", "library")}  # fmt: skip
    assert ran["cli"][0] == "1" and set(ran["cli"][1:]) == {"1"}, ran
    assert ran["library"][0] == "None" and "1" not in ran["library"][1:], ran

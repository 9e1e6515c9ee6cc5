"""Isolation: jobs run in children forked from a warm server; hangs, crashes and OOMs become results."""

from __future__ import annotations

import importlib.util
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zoo_convert.errors import UnsafeForkServerError
from zoo_convert.farm.isolation import ForkServer, fork_server, run_isolated
from zoo_convert.pipeline import StageCallback
from zoo_convert.records import PASSED, ConversionResult, ManifestEntry, Settings

# the fork server these tests start warms by importing torch and the exporters; timeouts of seconds, CPU use measured
pytestmark = [pytest.mark.slow, pytest.mark.alone]

TESTS = Path(__file__).resolve().parent

ENTRY = ManifestEntry(source="fault", row=7, tags=("t",))


def quick(entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None) -> ConversionResult:
    return ConversionResult(source=entry.source, status=PASSED)


def hang(entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None) -> ConversionResult:
    time.sleep(3600)
    raise AssertionError("unreachable")


def segfault(entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None) -> ConversionResult:
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("unreachable")


def hog(entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None) -> ConversionResult:
    chunks = []
    while True:
        chunks.append(bytearray(64 * 2**20))  # bytearray touches its pages: RSS grows
        time.sleep(0.005)


def raises(entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None) -> ConversionResult:
    raise RuntimeError("bug in a job function")


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(out_dir=str(tmp_path_factory.mktemp("iso")), bench_warmup=0, bench_runs=2)


def test_real_conversion_in_a_warm_child(zoo_dir: Path, settings: Settings) -> None:
    from zoo_convert.pipeline import convert_one

    entry = ManifestEntry(source=str(zoo_dir / "bert"), task="fill-mask", variants=("fp32",))
    result = run_isolated(convert_one, entry, settings, timeout_s=300)
    assert result.passed, result.message
    assert result.variant("fp32").max_abs is not None


def test_the_same_child_runs_jobs_repeatedly(settings: Settings) -> None:
    for _ in range(3):
        assert run_isolated(quick, ENTRY, settings).passed
    # the overhead target (< 150 ms per job) is measured in benchmarks/bench_isolation.py


def blas_threads(entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None) -> ConversionResult:
    import numpy as np
    from threadpoolctl import threadpool_info

    np.ones(1 << 17) @ np.ones(1 << 17)  # a call large enough for OpenBLAS to start its threads
    blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    return ConversionResult(source=entry.source, status=PASSED, message=" ".join(map(str, blas)))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: OpenBLAS runs one thread anyway")
def test_a_job_runs_numpy_blas_on_one_thread(settings: Settings) -> None:
    # Each extra OpenBLAS thread spin-waits after every call, on CPUs the job's PyTorch and ONNX Runtime or the
    # node's other jobs use: ~6 % of make demo's CPU time (node.one_blas_thread, in the server's environment).
    threads = run_isolated(blas_threads, ENTRY, settings).message.split()
    assert threads and set(threads) == {"1"}, threads  # numpy's OpenBLAS, and scipy's once something imported it


def triton_state(entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None) -> ConversionResult:
    import sys

    import torch  # the warm parent imported it, and transformers' masking code, which imports torch._dynamo

    loaded = sys.modules.get("triton") is not None
    return ConversionResult(source=entry.source, status=PASSED, message=f"{loaded} {'torch._dynamo' in sys.modules}")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="no triton installed (torch's CPU wheel)")
def test_a_job_runs_without_triton(settings: Settings) -> None:
    # 72 MB of every job's memory for torch.compile's GPU kernels (node.no_triton, in the server before its warm-up).
    assert run_isolated(triton_state, ENTRY, settings).message == "False True"


def crash_in_verify(
    entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None
) -> ConversionResult:
    assert on_stage is not None, "isolation passes the stage callback"
    on_stage("verify[fp16]")
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("unreachable")


def test_a_crash_records_the_stage_it_happened_in(zoo_dir: Path, settings: Settings) -> None:
    entry = ManifestEntry(source=str(zoo_dir / "bert"), row=3)
    result = run_isolated(crash_in_verify, entry, settings)
    assert (result.failure_kind, result.stage) == ("crash", "verify")
    assert "SIGSEGV" in result.message and "verify[fp16]" in result.message
    assert result.model_type == "bert"


@pytest.mark.parametrize(
    ("fn", "kwargs", "kind"),
    [
        (hang, {"timeout_s": 1.0}, "timeout"),
        (segfault, {}, "crash"),
        (hog, {"memory_gb": 1.5}, "oom"),
        (raises, {}, "internal"),
    ],
)
def test_faults_become_results(fn, kwargs: dict, kind: str, settings: Settings) -> None:
    t0 = time.monotonic()
    result = run_isolated(fn, ENTRY, settings, **kwargs)
    assert result.failure_kind == kind, result.message
    assert (result.row, result.tags, result.status) == (7, ("t",), "failed")
    assert time.monotonic() - t0 < 30
    # the server survives: the next job runs normally
    assert run_isolated(quick, ENTRY, settings).passed


def where_am_i(entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None) -> ConversionResult:
    """Reports the child's parent (the server), GPU mask and working directory."""
    seen = f"{os.getppid()} {os.environ.get('CUDA_VISIBLE_DEVICES')} {os.getcwd()}"
    return ConversionResult(source=entry.source, status=PASSED, message=seen)


def hang_with_pidfile(
    entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None
) -> ConversionResult:
    Path(settings.out_dir, "job.pid").write_text(str(os.getpid()))
    time.sleep(3600)
    raise AssertionError("unreachable")


def _in_another_process(job: str, out_dir: Path) -> subprocess.Popen:
    """Another caller on this machine (a second Ray worker, say) running ``job`` from this module."""
    code = (
        "from test_isolation import *; from zoo_convert.records import Settings;"
        f"print(run_isolated({job}, ENTRY, Settings(out_dir={str(out_dir)!r})).message)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)


def test_callers_share_one_server_and_jobs_run_in_the_callers_context(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # as Ray sets it for a GPU task
    monkeypatch.chdir(tmp_path)
    server, gpus, cwd = run_isolated(where_am_i, ENTRY, settings).message.split()
    assert (gpus, cwd) == ("3", str(tmp_path)) and int(server) == fork_server().server_pid
    other = _in_another_process("where_am_i", tmp_path)
    assert other.communicate(timeout=120)[0].split()[0] == server  # one warm parent per machine, not per caller


def test_a_job_dies_with_its_caller(settings: Settings, tmp_path: Path) -> None:
    caller = _in_another_process("hang_with_pidfile", tmp_path)
    pidfile = tmp_path / "job.pid"
    deadline = time.monotonic() + 120
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    job = int(pidfile.read_text())
    caller.kill()  # a Ray worker lost with its node
    caller.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{job}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{job}").exists()
    assert run_isolated(quick, ENTRY, settings).passed  # the server itself carries on


@pytest.mark.slow
def test_a_killed_server_is_reported_then_replaced(settings: Settings) -> None:
    assert run_isolated(quick, ENTRY, settings).passed
    old = fork_server().server_pid
    os.kill(old, signal.SIGKILL)
    lost = run_isolated(quick, ENTRY, settings)
    assert lost.failure_kind == "worker_lost", lost.message  # the farm retries these
    assert run_isolated(quick, ENTRY, settings).passed
    assert fork_server().server_pid not in (None, old)


@pytest.mark.slow
def test_a_server_nobody_uses_exits(tmp_path: Path, settings: Settings) -> None:
    address = str(tmp_path / "s" / "fork.sock")
    (tmp_path / "s").mkdir(mode=0o700)
    client = ForkServer(address, preload="zoo_convert.records", linger_s=0.5)  # a light preload: no warm-up
    client.run(quick, ENTRY, settings, str(tmp_path / "r.json"), 30, None)
    pid = client.server_pid
    client.close()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists() and not Path(address).exists()


# Binds as root (the folder is root's, 0700), then listens as another user: the socket's
# peer credentials are the listener's. Prints how many bytes the client sent it.
_FOREIGN_LISTENER = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o777)
os.setgid(int(sys.argv[2]))
os.setuid(int(sys.argv[2]))
s.listen(1)
print("ready", flush=True)
s.settimeout(60)
conn, _ = s.accept()
conn.settimeout(5)
got = 0
try:
    while chunk := conn.recv(1 << 16):
        got += len(chunk)
except socket.timeout:
    pass
print(got, flush=True)
"""

needs_root = pytest.mark.skipif(os.getuid() != 0, reason="acting as another user needs root (CI runs as root)")


@needs_root
def test_a_listener_of_another_user_receives_nothing(tmp_path: Path, settings: Settings) -> None:
    folder = tmp_path / "s"
    folder.mkdir(mode=0o700)
    address = str(folder / "fork.sock")
    nobody = pwd.getpwnam("nobody").pw_uid
    listener = subprocess.Popen([sys.executable, "-c", _FOREIGN_LISTENER, address, str(nobody)], stdout=subprocess.PIPE, text=True)
    assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
    try:
        with pytest.raises(UnsafeForkServerError, match=f"served by uid {nobody}") as refused:
            client = ForkServer(address, preload="zoo_convert.records", linger_s=0.5)
            client.run(quick, ENTRY, settings, str(tmp_path / "r.json"), 10, None)
        assert str(folder) in str(refused.value) and refused.value.folder == str(folder)
        assert listener.communicate(timeout=30)[0].strip() == "0"
    finally:
        listener.kill()
        listener.wait()


def _foreign_owner(folder: Path) -> None:
    folder.mkdir(mode=0o700)
    os.chown(folder, pwd.getpwnam("nobody").pw_uid, -1)


def _open_mode(folder: Path) -> None:
    folder.mkdir()
    folder.chmod(0o777)


def _symlink(folder: Path) -> None:
    real = folder.with_name("real")
    real.mkdir(mode=0o700)  # our own, 0700: only the link is wrong
    folder.symlink_to(real)


def _a_file(folder: Path) -> None:
    folder.write_text("")


@needs_root
@pytest.mark.parametrize(
    ("plant", "problem"),
    [(_foreign_owner, "belongs to uid"), (_open_mode, "has mode 0777"), (_symlink, "is a symbolic link"),
     (_a_file, "is not a directory")],
)  # fmt: skip
def test_a_planted_socket_folder_is_refused_before_anything_starts(tmp_path: Path, plant, problem: str) -> None:
    folder = tmp_path / "s"
    plant(folder)
    with pytest.raises(UnsafeForkServerError, match=problem) as refused:
        ForkServer(str(folder / "fork.sock"), preload="zoo_convert.records", linger_s=0.5)
    assert f"{folder} {problem}" in str(refused.value) and "rm -rf" in str(refused.value)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.name != "real") == ["s"]  # no lock, log or socket made


def spinning(entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None) -> ConversionResult:
    """One stage of 1 CPU second of work beside a spinning grandchild; their pids in ``<source>.pids``."""
    from zoo_convert.pipeline import _Run
    from zoo_convert.stages.forked import paused_windows, unpaused_clock

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    Path(entry.source + ".pids").write_text(f"{os.getpid()} {spinner.pid}")
    run, t0 = _Run(entry, on_stage), time.time()
    with run.stage("export") as details:
        c0 = unpaused_clock()  # the clock a target's rows are timed on
        spun = time.process_time() + 1.0  # CPU time: a stopped process does not advance it
        while time.process_time() < spun:
            pass
        details["clock"] = unpaused_clock() - c0
    spinner.kill()
    return ConversionResult(source=entry.source, status=PASSED, stages=tuple(run.stages),
                            paused=tuple(paused_windows(t0)))  # fmt: skip


class _PhaseOnce:
    """A node whose latency phase begins once, 0.5 s into the job, and lasts 1 s (isolation.Lease, as farm.driver's)."""

    def __init__(self, pids: Path) -> None:
        self.pids, self.t0, self.paused = pids, time.monotonic(), 0
        self.seen: list[tuple[str, float]] = []  # (state, CPU seconds) of the job and its spinner, while paused

    def acquire(self) -> tuple[int, ...] | None:
        return None

    def release(self) -> None:
        pass

    def after_phase(self) -> None:
        pass

    def phase_began(self) -> bool:
        return not self.paused and self.pids.exists() and time.monotonic() - self.t0 > 0.5

    def pause(self) -> None:
        self.paused += 1
        for _ in range(2):
            for pid in self.pids.read_text().split():
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                self.seen.append((stat[0], (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")))
            time.sleep(0.5)


def test_a_paused_job_is_stopped_whole_and_its_stage_leaves_the_pause_out(settings: Settings, tmp_path: Path) -> None:
    """When its node's phase begins, the job and its children are stopped (no CPU used) until the phase is over;
    the job's record keeps the window, its stage's seconds leave it out, and the timeout does not count it."""
    entry = ManifestEntry(source=str(tmp_path / "job"), row=1)
    lease = _PhaseOnce(tmp_path / "job.pids")
    started = time.monotonic()
    result = run_isolated(spinning, entry, settings, timeout_s=1.8, lease=lease)
    wall = time.monotonic() - started
    assert result.passed, result.message  # 1 s of work + 1 s paused, within a 1.8 s timeout: the pause is off its clock
    assert lease.paused == 1 and wall >= 2.0
    states, cpu = [s for s, _ in lease.seen], [c for _, c in lease.seen]
    assert states == ["T"] * 4, lease.seen  # the job and its grandchild, both stopped, at the pause's start and end
    assert cpu[2] - cpu[0] < 0.05 and cpu[3] - cpu[1] < 0.05, lease.seen  # no CPU used while stopped
    ((p0, p1),) = result.paused
    assert 0.95 < p1 - p0 < 1.5
    (stage,) = result.stages
    assert 0.95 < stage.seconds < 1.5, stage  # the stage's second of work, not the second it was stopped
    assert 0.95 < stage.details["clock"] < 1.5, stage  # the job's clock stopped with it

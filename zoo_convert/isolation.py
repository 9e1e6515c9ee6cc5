"""Run one job in a killable child process forked from a warm parent.

Importing torch, transformers and optimum costs seconds; forking costs tens of
milliseconds. Each process that runs jobs (a Ray worker, a test) lazily starts
one fork server: a fresh ``python`` that imports :mod:`zoo_convert._warm`
(the toolchain, plus one tiny conversion run single-threaded) and then forks one
child per job. A job pays neither the imports nor the first-call costs, and
whatever the child does (hang, segfault, eat memory) cannot take down the caller::

    caller (Ray worker) --request--> fork server (warm) --fork--> job child
        |  <-- child pid, later its wait status --                  |
        |  watches wall clock and the child's resident memory;      |
        |  kills the child by pid                                   |
        +<------------------- result.json (a temp file) ------------+

The caller never forks itself: a Ray worker is multithreaded, and forking a
process whose OpenMP pool is running deadlocks the child. (multiprocessing's
own forkserver would do, but it re-imports the caller's ``__main__`` in every
child: Ray's worker script, at a cost of a second per job.)

Exit mapping: a hard timeout -> ``timeout``; RSS above the job's limit (killed
by us) or SIGKILL from elsewhere (the kernel's OOM killer) -> ``oom``; any other
signal or an exit without a result -> ``crash``; the fork server itself gone ->
``worker_lost``.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import FailureKind
from .records import FAILED, ConversionResult, ManifestEntry, Settings
from .versions import toolchain_versions

JobFn = Callable[[ManifestEntry, Settings], ConversionResult]

WARM_MODULE = "zoo_convert._warm"
# How often the caller samples the child's memory; the child's exit is noticed at once.
POLL_S = 0.05
_PR_SET_PDEATHSIG = 1
_PAGE = os.sysconf("SC_PAGE_SIZE")
_CRASH_SIGNALS = {signal.SIGSEGV: "segmentation fault", signal.SIGABRT: "abort", signal.SIGBUS: "bus error",
                  signal.SIGILL: "illegal instruction", signal.SIGFPE: "floating point exception"}  # fmt: skip


class _ServerLost(Exception):
    """The fork server closed its socket (it died or was killed)."""


def run_isolated(
    job_fn: JobFn,
    entry: ManifestEntry,
    settings: Settings,
    *,
    timeout_s: float | None = None,
    memory_gb: float | None = None,
) -> ConversionResult:
    """Run ``job_fn(entry, settings)`` in a warm forked child; hangs, crashes and OOMs become results."""
    timeout = timeout_s if timeout_s is not None else (entry.timeout_s or settings.timeout_s)
    limit_gb = memory_gb if memory_gb is not None else entry.memory_gb
    limit = int(limit_gb * 1024**3) if limit_gb else None
    started_at = _now()
    with tempfile.TemporaryDirectory(prefix="zoo-job-") as tmp:
        out = Path(tmp, "result.json")
        try:
            verdict, status = fork_server().run(job_fn, entry, settings, str(out), timeout, limit)
        except _ServerLost as exc:
            return failure_result(entry, FailureKind.WORKER_LOST, f"fork server lost: {exc}", started_at=started_at)
        if verdict is None and status == 0 and out.exists():
            return ConversionResult.from_json(out.read_text())
        where = _read_breadcrumb(out)
    stage = where.split("[")[0] if where else None
    if verdict is FailureKind.TIMEOUT:
        kind, message = verdict, f"no answer after the hard timeout of {timeout:g} s; killed"
    elif verdict is FailureKind.OOM:
        kind, message = verdict, f"resident memory passed the limit of {limit_gb:g} GiB; killed"
    else:
        kind, message = _exit_verdict(status)
    return failure_result(entry, kind, f"{message} during {where}" if where else message, started_at=started_at, stage=stage)


class ForkServer:
    """Client side of one warm fork server process; one job at a time."""

    def __init__(self, preload: str = WARM_MODULE) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        code = f"from zoo_convert.isolation import _serve; _serve({theirs.fileno()}, {preload!r})"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env
        )
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()

    def run(
        self, job_fn: JobFn, entry: ManifestEntry, settings: Settings, out: str, timeout: float, limit: int | None
    ) -> tuple[FailureKind | None, int]:
        """Fork one child for the job and watch it; return (our verdict or None, its wait status)."""
        with self.lock:
            _send(self.sock, (job_fn, entry, settings, out))
            # the first request also waits out the server's warm-up, so the clock starts at the fork
            pid = _recv(self.sock, None)
            deadline = time.monotonic() + timeout
            verdict = None
            while True:
                left = deadline - time.monotonic()
                status = _recv(self.sock, max(0.0, min(POLL_S, left)))
                if status is not None:
                    return verdict, status
                if verdict is not None:
                    continue
                if time.monotonic() >= deadline:
                    verdict = FailureKind.TIMEOUT
                elif limit is not None and (_rss(pid) or 0) > limit:
                    verdict = FailureKind.OOM
                if verdict is not None:
                    _signal(pid, signal.SIGKILL)

    def alive(self) -> bool:
        """Whether the server process is still running."""
        return self.proc.poll() is None

    def close(self) -> None:
        """Stop the server (its running child, if any, dies with it)."""
        self.sock.close()
        self.proc.wait()


_lock = threading.Lock()
_server: ForkServer | None = None


def fork_server() -> ForkServer:
    """This process's fork server, started on first use and again if it died."""
    global _server
    with _lock:
        if _server is None or not _server.alive():
            _server = ForkServer()
        return _server


def _serve(fd: int, preload: str) -> None:
    """The fork server's loop: warm up, then fork one child per request and report its exit."""
    _die_with_parent()
    __import__(preload)
    sock = socket.socket(fileno=fd)
    while True:
        try:
            job_fn, entry, settings, out = _recv(sock, None)
        except _ServerLost:
            return
        pid = os.fork()
        if pid == 0:
            sock.close()
            code = 1
            try:
                _child(job_fn, entry, settings, out)
                code = 0
            finally:
                os._exit(code)
        _send(sock, pid)
        _, status = os.waitpid(pid, 0)
        _send(sock, os.waitstatus_to_exitcode(status))


def _send(sock: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj)
    sock.sendall(struct.pack("!Q", len(data)) + data)


def _recv(sock: socket.socket, timeout: float | None) -> Any:
    """One message; None when ``timeout`` passes first; _ServerLost on EOF."""
    if timeout is not None and not select.select([sock], [], [], timeout)[0]:
        return None
    (size,) = struct.unpack("!Q", _read(sock, 8))
    return pickle.loads(_read(sock, size))


def _read(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise _ServerLost("fork server closed its socket")
        buf += chunk
    return bytes(buf)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def failure_result(
    entry: ManifestEntry, kind: FailureKind, message: str, *, started_at: str | None = None, stage: str | None = None
) -> ConversionResult:
    """A failed result for a job that produced none of its own (killed, lost, never valid)."""
    return ConversionResult(
        source=entry.source,
        status=FAILED,
        task=entry.task,
        revision=entry.revision,
        exporter=entry.exporter,
        opset_requested=entry.opset,
        model_type=_model_type(entry.source),
        failure_kind=kind.value,
        stage=stage or kind.stage,
        message=message,
        versions=toolchain_versions(),
        started_at=started_at or _now(),
        finished_at=_now(),
        node=socket.gethostname(),
        row=entry.row,
        tags=entry.tags,
    )


def _model_type(source: str) -> str | None:
    """A local checkpoint's model_type, so a job that died still lands in the right matrix row."""
    try:
        return json.loads(Path(source, "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def _child(job_fn: JobFn, entry: ManifestEntry, settings: Settings, out: str) -> None:
    """Runs in the forked child: do the job, leave the result where the caller looks."""
    from . import pipeline

    _die_with_parent()
    breadcrumb = Path(out + ".stage")
    pipeline.on_stage = breadcrumb.write_text
    try:
        result = job_fn(entry, settings)
    except Exception as exc:  # noqa: BLE001 - job_fn should never raise; if it does, that is our bug
        result = failure_result(entry, FailureKind.INTERNAL, f"{type(exc).__name__}: {exc}")
        result = ConversionResult.from_dict({**result.to_dict(), "traceback": traceback.format_exc()})
    tmp = out + ".part"
    Path(tmp).write_text(result.to_json())
    os.replace(tmp, out)  # the caller never reads half a file
    sys.stdout.flush()
    sys.stderr.flush()


def _read_breadcrumb(out: Path) -> str | None:
    """The stage the child had reached when it died, if it got that far."""
    try:
        return Path(str(out) + ".stage").read_text() or None
    except OSError:
        return None


def _exit_verdict(exitcode: int) -> tuple[FailureKind, str]:
    if exitcode < 0:
        sig = signal.Signals(-exitcode)
        if sig == signal.SIGKILL:
            return FailureKind.OOM, "killed by SIGKILL (most likely the kernel's OOM killer)"
        return FailureKind.CRASH, f"job process died of {sig.name} ({_CRASH_SIGNALS.get(sig, 'signal')})"
    return FailureKind.CRASH, f"job process exited with status {exitcode} without a result"


def _rss(pid: int) -> int | None:
    """Resident bytes of a process (Linux /proc; None elsewhere or once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent goes, so no job outlives its worker."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")

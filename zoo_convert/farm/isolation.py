"""Run one job in a killable child process forked from a warm parent.

Importing torch, transformers and optimum costs seconds; forking costs tens of
milliseconds. Every process on a machine that runs jobs (each Ray worker, the
driver, a test) shares one fork server: a daemon that imports
:mod:`zoo_convert.farm.warm` (the toolchain, plus one tiny conversion run
single-threaded), freezes its heap for the garbage collector, and then forks one
child per job. A job pays neither the imports nor the first-call costs, and
whatever the child does (hang, segfault, eat memory) cannot take down the caller.
A run with ``torch``-exporter rows forks from a server that also warmed the torch exporter
(:mod:`zoo_convert.farm.warm_torch`, ``Settings.warm_torch_exporter``): a server of its own, so
an optimum-only run neither pays that warm-up nor meets it::

    caller (Ray worker) --unix socket--> fork server (warm, one per machine) --pipe--> spare child
        |  <-- child pid; "done" once its result is written, or its exit status --       |
        |  watches wall clock and the child's resident memory;                           |
        |  kills the child by pid                                                        |
        +<-------------------------------- result.json (a temp file) --------------------+

The server keeps one child forked ahead (the spare) and hands it the next request, so
starting a job costs a pipe write instead of a fork; a job is over when its child says
its result is written, not when the kernel has finished tearing the child down. Both
keep ~40 ms per job out of the job slot (bench_isolation.py).

One server per machine, not per worker: a warm parent holds ~500 MB, so a 64-CPU
node keeps one instead of 64, and it warms up once. The first process that needs
it starts it (under a lock file), so a farm driver that starts a local Ray
instance starts it before ``ray.init`` and the warm-up overlaps Ray's start-up.
The server lives while any caller is connected and exits ``LINGER_S`` after the
last one leaves. Its socket lives in a per-user 0700 folder and it serves its
own user only (``SO_PEERCRED``): requests carry pickled code. The folder's name
is predictable, so before sending a byte the caller checks it too: a real
directory of its own with mode 0700, and a listener of its own uid
(``SO_PEERCRED`` again); anything else raises :class:`UnsafeForkServerError`,
which stops a farm run instead of failing its jobs. The socket name
hashes the interpreter and zoo_convert's source, so a changed checkout never
reaches an old server. The server never unpickles a job itself: the child does,
after taking the caller's ``sys.path``, environment (``CUDA_VISIBLE_DEVICES``
as Ray set it for that task) and working directory.

The caller never forks itself: a Ray worker is multithreaded, and forking a
process whose OpenMP pool is running deadlocks the child. (multiprocessing's
own forkserver would do, but it re-imports the caller's ``__main__`` in every
child: Ray's worker script, at a cost of a second per job.) The server and the
jobs write their output to ``<socket>.log``.

Exit mapping: a hard timeout -> ``timeout``; RSS above the job's limit (killed
by us) or SIGKILL from elsewhere (the kernel's OOM killer) -> ``oom``; any other
signal or an exit without a result -> ``crash``; the fork server itself gone ->
``worker_lost``. A job that ends in any of these wrote no result to point at the
artifact folder it had claimed, half written: the child notes each folder it
claims (:func:`note_claimed`) beside its result file, and the caller removes them.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gc
import hashlib
import os
import pickle
import select
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple, Protocol

from .. import __version__
from ..errors import FailureKind, UnsafeForkServerError, first_line
from ..records import FAILED, ConversionResult, ManifestEntry, Settings
from ..stages.forked import claim_into, die_with_parent, grant, paused_path, set_lease_paths
from ..node import no_triton, one_blas_thread, toolchain_versions


class JobFn(Protocol):
    """What a job runs: ``pipeline.convert_one``, or a test's stand-in with its signature."""

    def __call__(
        self, entry: ManifestEntry, settings: Settings, *, on_stage: Callable[[str], None] | None = None
    ) -> ConversionResult: ...


class Lease(Protocol):
    """The node to one job for its benchmark (the farm's latency phase): ``acquire`` blocks until it is this job's.

    ``acquire`` returns the CPUs the job's processes are pinned to while the node times others beside
    it on other CPUs, or None where the node is the job's alone.
    """

    def acquire(self) -> tuple[int, ...] | None: ...

    def release(self) -> None: ...

    def phase_began(self) -> bool:
        """Whether the node's latency phase began while this job converts (it is then paused); never blocks."""
        ...

    def pause(self) -> None:
        """The job's processes are stopped: block until the node's phase is over."""
        ...

    def after_phase(self) -> None:
        """Block until the node's latency phase is over (at once if it is not in one)."""
        ...


WARM_MODULE = "zoo_convert.farm.warm"
# The preload of a run with torch-exporter rows: WARM_MODULE, then one tiny dynamo export (a server of its own).
WARM_TORCH_MODULE = "zoo_convert.farm.warm_torch"
# How often the caller samples the child's memory; the child's exit is noticed at once.
POLL_S = 0.05
# How long the server waits for a caller once the last one has left.
LINGER_S = 10.0
_PAGE = os.sysconf("SC_PAGE_SIZE")
_CRASH_SIGNALS = {signal.SIGSEGV: "segmentation fault", signal.SIGABRT: "abort", signal.SIGBUS: "bus error",
                  signal.SIGILL: "illegal instruction", signal.SIGFPE: "floating point exception"}  # fmt: skip


class _ServerLost(Exception):
    """The fork server closed its socket (it died or was killed)."""


# A caller's request: its sys.path, environment and working directory, and the pickled (job_fn, entry, settings, out).
_Request = tuple[list[str], dict[str, str], str, bytes]


class _News(NamedTuple):
    """The server's news to a caller: ``started`` (value: the server's pid), ``done`` or ``exit`` (value: exit code)."""

    what: str
    pid: int
    value: int = 0


def run_isolated(
    job_fn: JobFn,
    entry: ManifestEntry,
    settings: Settings,
    *,
    timeout_s: float | None = None,
    memory_gb: float | None = None,
    lease: Lease | None = None,
) -> ConversionResult:
    """Run ``job_fn(entry, settings)`` in a warm forked child; hangs, crashes and OOMs become results.

    With a ``lease``, the job's benchmark (``forked.alone_on_node``) waits for it; the wait does not count
    against the timeout, and a job that dies holding it gives it back.
    """
    timeout = timeout_s if timeout_s is not None else (entry.timeout_s or settings.timeout_s)
    limit_gb = memory_gb if memory_gb is not None else entry.memory_gb
    limit = int(limit_gb * 1024**3) if limit_gb else None
    started_at = _now()
    # Recorded with the result: a timeout is redone by a later run that allows longer (plan.py).
    result = _run_isolated(job_fn, entry, settings, timeout, limit, limit_gb, started_at, lease)
    return replace(result, timeout_s=timeout)


def _run_isolated(
    job_fn: JobFn,
    entry: ManifestEntry,
    settings: Settings,
    timeout: float,
    limit: int | None,
    limit_gb: float | None,
    started_at: str,
    lease: Lease | None = None,
) -> ConversionResult:
    with tempfile.TemporaryDirectory(prefix="zoo-job-") as tmp:
        out = Path(tmp, "result.json")
        try:
            verdict, status = fork_server(preload=preload_for(settings)).run(
                job_fn, entry, settings, str(out), timeout, limit, lease
            )
        except _ServerLost as exc:
            _discard_claimed(out, Path(settings.out_dir))
            return failure_result(entry, FailureKind.WORKER_LOST, f"fork server lost: {exc}", started_at=started_at)
        if verdict is None and status == 0 and out.exists():
            return ConversionResult.from_json(out.read_text())
        _discard_claimed(out, Path(settings.out_dir))  # no result: nothing points at what the child half wrote
        where = _read_breadcrumb(out)
    stage = where.split("[")[0] if where else None
    kind: FailureKind
    if verdict is FailureKind.TIMEOUT:
        kind, message = verdict, f"no answer after the hard timeout of {timeout:g} s; killed"
    elif verdict is FailureKind.OOM:
        kind, message = verdict, f"resident memory passed the limit of {limit_gb:g} GiB; killed"
    else:
        kind, message = _exit_verdict(status)
    return failure_result(entry, kind, f"{message} during {where}" if where else message, started_at=started_at, stage=stage)


class _Held:
    """The caller's side of one job's benchmark lease: asked in a file, granted through a FIFO, freed in the file;
    and the job paused while its node's latency phase times others."""

    def __init__(self, lease: Lease | None, ask: Path, fifo: Path) -> None:
        self.lease, self.ask, self.fifo = lease, ask, fifo
        self.state = "none"  # none -> acquired (granting) -> granted -> held (phase over: resuming) -> freed
        self.pid: int | None = None  # the job's process, once started

    def serve(self) -> float:
        """Act on what the job said; returns the seconds spent waiting for the lease or paused (off the job's clock)."""
        if self.lease is None or self.state == "freed":
            return 0.0
        try:
            said = self.ask.read_text()
        except OSError:
            said = ""
        lease = self.lease
        if self.state == "none" and said != "ask" and self.pid is not None and lease.phase_began():
            return self._pause(lease, self.pid)
        waited = 0.0
        if self.state == "none" and said == "ask":
            t0 = time.monotonic()
            cpus = self.lease.acquire()
            waited = time.monotonic() - t0
            if cpus is not None and self.pid is not None:
                pin_tree(self.pid, cpus)  # before the grant: nothing of the job is timed off its CPUs
            self.state = "acquired"
        if self.state == "acquired" and grant(self.fifo):
            self.state = "granted"
        if self.state == "granted" and said == "free":
            # Timed: the lease goes back now, but the job goes on only once the phase is over. What it does
            # next (its result, its processes' teardown, the driver's writes, the next task's start) was the other
            # lanes' most frequent interference: a fifth of their blocks noisy and timed again (docs/how-a-job-runs.md).
            lease.release()
            self.state = "held"
            t0 = time.monotonic()
            lease.after_phase()
            waited += time.monotonic() - t0
        if self.state == "held" and grant(self.fifo):
            self.state = "freed"
        return waited

    def _pause(self, lease: Lease, pid: int) -> float:
        """Stop the job's processes for its node's phase, let them go on after it; the seconds stopped.

        The window goes into the job's paused file first (``forked.paused_windows``): its stages
        leave it out of their seconds, and no one reads a stopped conversion as one beside a benchmark.
        """
        t0, w0 = time.monotonic(), time.time()
        stopped = signal_tree(pid, signal.SIGSTOP)
        try:
            lease.pause()
        finally:
            with contextlib.suppress(OSError), open(paused_path(self.ask), "a") as f:
                f.write(f"{w0:.4f} {time.time():.4f}\n")
            for proc in stopped:
                _signal(proc, signal.SIGCONT)
        return time.monotonic() - t0

    def give_back(self) -> None:
        """Release the lease if this job holds it (also when it died holding it)."""
        if self.lease is not None and self.state in ("acquired", "granted"):
            self.state = "freed"
            self.lease.release()


def _walk_tree(pid: int, act: Callable[[int], bool]) -> list[int]:
    """``act`` on ``pid`` and on each of its descendants, on a process before its threads' children are listed; the
    processes it reached (``act`` says False for one gone)."""
    reached: list[int] = []
    todo = [pid]
    while todo:
        proc = todo.pop()
        if proc in reached or not act(proc):
            continue
        reached.append(proc)
        try:
            tids = os.listdir(f"/proc/{proc}/task")
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError, ValueError), open(f"/proc/{proc}/task/{tid}/children") as f:
                todo += [int(c) for c in f.read().split()]
    return reached


def signal_tree(pid: int, sig: int) -> list[int]:
    """Send ``sig`` to ``pid`` and to each of its descendants; the processes it reached, to send SIGCONT later.

    With SIGSTOP each is stopped before its children are listed: stopped, it starts no more."""

    def send(proc: int) -> bool:
        try:
            os.kill(proc, sig)
        except (ProcessLookupError, PermissionError):
            return False
        if sig == signal.SIGSTOP:
            _until_stopped(proc)
        return True

    return _walk_tree(pid, send)


def _until_stopped(pid: int, within_s: float = 0.2) -> None:
    """Wait (briefly) until ``pid`` is stopped: a signal is delivered when the process next runs, not when sent."""
    until = time.monotonic() + within_s
    while time.monotonic() < until:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("T", "t", "Z", "X"):
            return
        time.sleep(0.001)


def pin_tree(pid: int, cpus: tuple[int, ...]) -> None:
    """Pin every thread of ``pid`` and of its descendants to ``cpus`` (Linux; elsewhere nothing).

    Each thread on its own: a process's affinity is its threads', and the job's runtimes hold
    pools made before the grant (a target child's OpenVINO or node, ONNX Runtime's); threads
    made later inherit it. A process or thread gone meanwhile is skipped.
    """
    if not hasattr(os, "sched_setaffinity"):
        return

    def pin(proc: int) -> bool:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{proc}/task")]
        except (OSError, ValueError):
            return False
        for tid in tids:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)
        return True

    _walk_tree(pid, pin)


class ForkServer:
    """One connection to the machine's fork server; one job at a time."""

    def __init__(self, address: str | None = None, preload: str = WARM_MODULE, linger_s: float = LINGER_S) -> None:
        self.address = address or default_address(preload)
        self.preload, self.linger_s = preload, linger_s
        self.sock = _connect_or_start(self.address, preload, linger_s)
        self.lock = threading.Lock()
        self.lost = False
        self.server_pid: int | None = None  # known after the first job
        self._fresh = True

    def run(
        self,
        job_fn: JobFn,
        entry: ManifestEntry,
        settings: Settings,
        out: str,
        timeout: float,
        limit: int | None,
        lease: Lease | None = None,
    ) -> tuple[FailureKind | None, int]:
        """Start the job in a child and watch it; return (our verdict or None, its exit status).

        The job is over when its child says its result is in place (status 0) or when it
        exits: a child tearing down a big address space does not hold up the next job.
        With a ``lease``, a child that asks for it (``forked.alone_on_node``) gets it here;
        the wait is added to its deadline.
        """
        if lease is not None:
            os.mkfifo(out + ".grant", 0o600)
        payload = pickle.dumps((job_fn, entry, settings, out, lease is not None))
        request: _Request = (sys.path, dict(os.environ), os.getcwd(), payload)
        held = _Held(lease, Path(out + ".lease"), Path(out + ".grant"))
        with self.lock:
            try:
                pid = held.pid = self._start(request)
                deadline = time.monotonic() + timeout
                verdict: FailureKind | None = None
                while True:
                    deadline += held.serve()
                    left = deadline - time.monotonic()
                    message = _recv(self.sock, max(0.0, min(POLL_S, left)))
                    if message is not None and message.pid == pid:  # others are late news of earlier jobs
                        if message.what == "exit":
                            return verdict, message.value
                        if message.what == "done" and verdict is None:
                            return None, 0
                    if verdict is not None:
                        continue
                    if time.monotonic() >= deadline:
                        verdict = FailureKind.TIMEOUT
                    elif limit is not None and (_rss(pid) or 0) > limit:
                        verdict = FailureKind.OOM
                    if verdict is not None:
                        _signal(pid, signal.SIGKILL)
            except _ServerLost:
                self.lost = True
                raise
            finally:
                held.give_back()

    def _start(self, request: _Request) -> int:
        """Send the request, return the job's pid; the first one also waits out the server's warm-up."""
        try:
            _send(self.sock, request)
            return self._started()
        except (_ServerLost, OSError):
            if not self._fresh:
                raise _ServerLost("fork server closed its socket") from None
            # A server that had just decided to exit for lack of callers: start (or find) a new one, once.
            self.sock.close()
            self.sock = _connect_or_start(self.address, self.preload, self.linger_s)
            _send(self.sock, request)
            return self._started()
        finally:
            self._fresh = False

    def _started(self) -> int:
        while True:
            message = _recv(self.sock, None)
            if message is not None and message.what == "started":
                self.server_pid = message.value
                return message.pid

    def close(self) -> None:
        """Leave the server (the server outlives us while others use it)."""
        self.sock.close()


_lock = threading.Lock()
_servers: dict[str, ForkServer] = {}


def fork_server(address: str | None = None, preload: str = WARM_MODULE) -> ForkServer:
    """This process's connection to the machine's fork server, started on first use and again if it died."""
    address = address or default_address(preload)
    with _lock:
        server = _servers.get(address)
        if server is None or server.lost:
            server = _servers[address] = ForkServer(address, preload)
        return server


def preload_for(settings: Settings) -> str:
    """The module the jobs' fork server preloads: the torch exporter warmed too only where the run uses it."""
    return WARM_TORCH_MODULE if settings.warm_torch_exporter else WARM_MODULE


@functools.cache
def default_address(preload: str) -> str:
    """The socket of this user's fork server for this environment, interpreter, preload and zoo_convert source.

    The environment is ``sys.prefix`` and the interpreter the file it resolves to: a venv's
    ``python`` and ``python3`` (the CLI's shebang) are one server, two venvs are two.
    """
    package = Path(__file__).resolve().parents[1]  # zoo_convert, not this module's farm/: every job runs all of it
    stamp = max(p.stat().st_mtime_ns for p in package.rglob("*.py"))
    interpreter = os.path.realpath(sys.executable)
    key = "\0".join((sys.prefix, interpreter, str(package), __version__, preload, str(stamp)))
    folder = Path(tempfile.gettempdir(), f"zoo-convert-{os.getuid()}")
    return str(folder / f"fork-{hashlib.sha256(key.encode()).hexdigest()[:16]}.sock")


def _connect_or_start(address: str, preload: str, linger_s: float) -> socket.socket:
    """Connect to the server at ``address``, starting it first when nobody is listening there.

    Requests carry the caller's environment and code: nothing is sent before the folder
    and whoever listens in it are known to be this user's own.
    """
    _make_private(Path(address).parent)
    sock = _connect(address)
    if sock is not None:
        return sock
    with open(address + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter per machine; the others find it listening
        sock = _connect(address)
        if sock is not None:
            return sock
        Path(address).unlink(missing_ok=True)  # left by a server that was killed
        with open(address + ".log", "w") as log:
            code = f"from zoo_convert.farm.isolation import _serve; _serve({address!r}, {preload!r}, {linger_s!r})"
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            one_blas_thread(env)  # the server imports numpy once for every job it forks
            proc = subprocess.Popen(
                [sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env=env, start_new_session=True,
            )  # fmt: skip
            # _serve binds and listens, then detaches: its first process exits once the socket accepts.
            if proc.wait() != 0:
                raise RuntimeError(f"the fork server did not start; see {address}.log")
        sock = _connect(address)
        if sock is None:
            raise RuntimeError(f"the fork server started but does not accept at {address}; see {address}.log")
        return sock


def _connect(address: str) -> socket.socket | None:
    """A connection to the server at ``address``; None when nobody listens there.

    Connecting sends nothing: the listener's uid is checked before the first request.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    if uid != os.getuid():
        sock.close()
        folder = Path(address).parent
        raise UnsafeForkServerError(
            _unsafe(folder, f"holds a socket served by uid {uid} (pid {pid}), not by this user (uid {os.getuid()})"),
            folder=str(folder),
        )
    return sock


def _make_private(folder: Path) -> None:
    """Create the socket folder with mode 0700, or check that the one there is this user's, 0700, no link."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(folder, 0o700)
        os.chmod(folder, 0o700)  # whatever the umask left
    except FileExistsError:
        pass
    st = os.lstat(folder)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != os.getuid():
        problem = f"belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})"
    elif mode != 0o700:
        problem = f"has mode {mode:04o}, not 0700"
    else:
        return
    raise UnsafeForkServerError(_unsafe(folder, problem), folder=str(folder))


def _unsafe(folder: Path, problem: str) -> str:
    return (
        f"the fork-server folder {folder} {problem}; jobs send it this process's environment (tokens included) "
        f"and code, so nothing was sent and no job ran. Remove it if you did not make it (rm -rf {folder}) "
        "or set TMPDIR to a folder only you can write, then run again"
    )


def _serve(address: str, preload: str, linger_s: float) -> None:
    """The fork server: listen, detach, warm up, then serve until no caller is left (see _Server)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(128)
    if os.fork() > 0:
        os._exit(0)  # the starter waits for this exit; the daemon below is nobody's child to be killed with it
    inode = os.stat(address).st_ino
    no_triton()  # every job's memory, less triton's (node.no_triton)
    __import__(preload)
    # Forked children then neither scan nor copy-on-write the warm heap when they collect (optimum calls gc.collect()).
    gc.collect()
    gc.freeze()
    _Server(listener, linger_s).loop()
    with contextlib.suppress(OSError):
        if os.stat(address).st_ino == inode:
            os.unlink(address)


@dataclass
class _Child:
    """A forked child of the server: a spare waiting for its job, or a job's process."""

    pid: int
    pidfd: int  # readable once the child has exited
    job_w: int | None  # the request goes down this pipe; closed once handed over
    done_r: int | None  # the child writes one byte here once its result is in place
    caller: socket.socket | None = None


class _Server:
    """The server's single-threaded loop: callers' requests, children's news, through one selector.

    One child is always forked ahead (the spare), so a request costs a pipe write, not a
    fork; the next spare is forked while the job runs.
    """

    def __init__(self, listener: socket.socket, linger_s: float) -> None:
        self.listener, self.linger_s = listener, linger_s
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.callers: set[socket.socket] = set()
        self.children: dict[int, _Child] = {}
        self.idle_since = time.monotonic()
        self.spare: _Child | None = self._fork()

    def loop(self) -> None:
        while self.callers or time.monotonic() - self.idle_since < self.linger_s:
            for key, _ in self.selector.select(timeout=min(1.0, self.linger_s)):
                if key.fileobj is self.listener:
                    self._accept()
                elif isinstance(key.fileobj, socket.socket):
                    self._request(key.fileobj)
                elif key.data[0] == "done":
                    self._done(key.data[1])
                else:
                    self._exited(key.data[1])

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", creds)[1] != os.getuid():
            conn.close()  # requests are code: only our own user may send them
            return
        self.selector.register(conn, selectors.EVENT_READ)
        self.callers.add(conn)

    def _request(self, conn: socket.socket) -> None:
        try:
            request = _read_message(conn)
        except (_ServerLost, OSError):
            self._drop(conn)
            return
        child = self._hand_over(request)
        child.caller = conn
        self._reply(conn, _News("started", child.pid, os.getpid()))
        self.spare = self._fork()

    def _hand_over(self, request: bytes) -> _Child:
        """The spare gets the request (a fresh child if the spare is gone)."""
        for _ in range(2):
            child, self.spare = self.spare or self._fork(), None
            job_w = child.job_w
            assert job_w is not None  # a child's job pipe closes only here, when it is handed its job
            try:
                _write_all(job_w, struct.pack("!Q", len(request)) + request)
            except BrokenPipeError:  # the spare died (reaped through its pidfd): fork another
                continue
            finally:
                os.close(job_w)
                child.job_w = None
            return child
        raise RuntimeError("fork-server children die before reading their job")

    def _fork(self) -> _Child:
        job_r, job_w = os.pipe()
        done_r, done_w = os.pipe()
        inherited = [self.listener.fileno(), self.selector.fileno(), *(c.fileno() for c in self.callers)]
        for c in self.children.values():
            inherited += [fd for fd in (c.pidfd, c.job_w, c.done_r) if fd is not None]
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for fd in [*inherited, job_w, done_r]:
                    os.close(fd)
                die_with_parent()  # no job outlives the server (one whose caller left: _drop)
                request = _read_fd_message(job_r)
                if request is not None:  # None: the server closed the pipe, no job for this spare
                    sys_path, env, cwd, payload = pickle.loads(request)
                    _child(sys_path, env, cwd, payload, done_w)
                code = 0
            except BaseException:  # noqa: BLE001 - the caller reads "no result"; the log keeps the traceback
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(job_r)
        os.close(done_w)
        child = _Child(pid, os.pidfd_open(pid), job_w, done_r)
        self.children[pid] = child
        self.selector.register(child.pidfd, selectors.EVENT_READ, ("exit", child))
        self.selector.register(done_r, selectors.EVENT_READ, ("done", child))
        return child

    def _done(self, child: _Child) -> None:
        if child.done_r is None:
            return
        said = os.read(child.done_r, 1)
        self._close_done(child)
        if said and child.caller in self.callers:
            self._reply(child.caller, _News("done", child.pid))

    def _exited(self, child: _Child) -> None:
        _, status = os.waitpid(child.pid, 0)
        self.selector.unregister(child.pidfd)
        os.close(child.pidfd)
        self._close_done(child)
        if child.job_w is not None:
            os.close(child.job_w)
        self.children.pop(child.pid)
        if child is self.spare:
            self.spare = None
        if child.caller in self.callers:
            self._reply(child.caller, _News("exit", child.pid, os.waitstatus_to_exitcode(status)))

    def _close_done(self, child: _Child) -> None:
        if child.done_r is not None:
            self.selector.unregister(child.done_r)
            os.close(child.done_r)
            child.done_r = None

    def _reply(self, conn: socket.socket, message: _News) -> None:
        try:
            _send(conn, message)
        except OSError:
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        """A caller left (or died): its running job dies with it, as it would have with a private server."""
        if conn not in self.callers:
            return
        for child in self.children.values():
            if child.caller is conn:
                # A caller that died while it had the job paused: its descendants go on first, so they see it go
                # (transformers.js's node exits at the end of its stdin; stopped, it would wait forever).
                signal_tree(child.pid, signal.SIGCONT)
                _signal(child.pid, signal.SIGKILL)  # reaped when its pidfd reports the exit
                child.caller = None
        self.callers.discard(conn)
        self.selector.unregister(conn)
        conn.close()
        if not self.callers:
            self.idle_since = time.monotonic()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_fd_message(fd: int) -> bytes | None:
    """One length-prefixed message from a pipe; None at end of file."""
    head = _read_fd(fd, 8)
    return None if head is None else _read_fd(fd, struct.unpack("!Q", head)[0])


def _read_fd(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _send(sock: socket.socket, obj: _Request | _News) -> None:
    data = pickle.dumps(obj)
    sock.sendall(struct.pack("!Q", len(data)) + data)


def _recv(sock: socket.socket, timeout: float | None) -> _News | None:
    """The server's next news; None when ``timeout`` passes first; _ServerLost on EOF."""
    if timeout is not None and not select.select([sock], [], [], timeout)[0]:
        return None
    news: _News = pickle.loads(_read_message(sock))
    return news


def _read_message(sock: socket.socket) -> bytes:
    """One length-prefixed message, still pickled."""
    (size,) = struct.unpack("!Q", _read(sock, 8))
    return _read(sock, size)


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


def _model_type(entry: ManifestEntry) -> str | None:
    """The model type config.json names, so a job that died still lands in the right matrix row.

    Looked at before it is read: this runs for a row that was never valid and for a job that was
    killed, and a config.json that is a FIFO or /dev/zero must not hang the driver.
    """
    from ..stages.fetch import (
        config_model_type,  # no torch: fetch imports its libraries lazily
    )

    return config_model_type(entry, Settings())


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
        model_type=_model_type(entry),
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


def _child(sys_path: list[str], env: dict[str, str], cwd: str, payload: bytes, done_fd: int) -> None:
    """Runs in the forked child: become the caller's child, do the job, leave the result where the caller looks."""
    # The caller's view: its imports (a test's or a benchmark's job function), its GPU, its relative paths.
    sys.path[:] = sys_path
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    job_fn, entry, settings, out, leased = pickle.loads(payload)
    claim_into(Path(out + ".claims"))
    set_lease_paths((Path(out + ".lease"), Path(out + ".grant")) if leased else None)
    breadcrumb = Path(out + ".stage")
    try:
        result = job_fn(entry, settings, on_stage=breadcrumb.write_text)
    except Exception as exc:  # noqa: BLE001 - job_fn should never raise; if it does, that is our bug
        result = failure_result(entry, FailureKind.INTERNAL, first_line(exc))
        result = ConversionResult.from_dict({**result.to_dict(), "traceback": traceback.format_exc()})
    tmp = out + ".part"
    Path(tmp).write_text(result.to_json())
    os.replace(tmp, out)  # the caller never reads half a file
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(done_fd, b"!")


def _discard_claimed(out: Path, out_root: Path) -> None:
    """Remove the artifact folders a child that left no result had claimed (each made by it alone, with mkdir, so no
    other job's and no recorded result's), and a model's folder left empty; only ever under ``out_root``."""
    try:
        claimed = Path(f"{out}.claims").read_text().splitlines()
    except OSError:
        return
    root = out_root.resolve()
    for line in claimed:
        folder = Path(line)
        if not folder.resolve().is_relative_to(root) or folder.resolve() == root:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # not empty: another job's artifacts are in it
            if folder.parent.resolve() != root:
                folder.parent.rmdir()


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


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")

"""One function in a short-lived forked child: its result comes back, its memory and its crashes do not.

The optimize stage makes every variant this way. Each ONNX transformation (fusion,
float16, quantization) holds transient copies of a model that no garbage collection
gives back to the system, and ONNX Runtime can segfault loading or running a graph
(wavlm's fp16): in a child, the job's process stays at its own size between
variants and a crash fails one variant instead of the whole job.

Forking a process that has run torch is safe only while the child touches neither
torch nor its OpenMP pool (a fork inherits the pool's locks, not its threads). The
children here run onnx, onnxruntime (its own thread pools, created in the child)
and numpy on memoized inputs; ``runtime.cases`` refuses to run a PyTorch forward
once the job's references are computed. Nor may a child destroy what it inherited
with threads behind it (an ONNX Runtime session of the parent): it freezes the
garbage collector's view of the parent's objects first, and closes only the
sessions it opened. tests/stages/test_optimize.py forks such a
child after torch has run a multi-threaded op and checks it finishes.

The child reports what it is doing (:func:`step`), so a crash says where it died;
an exception it raises comes back with its kind, first line and traceback
(:class:`~zoo_convert.errors.ForkedError`); a full disk comes back as the OSError it was.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import os
import pickle
import select
import signal
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar

from ..errors import (
    FailureKind,
    ForkedError,
    OptimizeError,
    ZooConvertError,
    first_line,
    is_our_bug,
    storage_fault,
)

# In a fork-server child: the file the job notes the artifact folders it claims in (see note_claimed);
# the fork server sets it (:func:`claim_into`) before the job runs.
_claims: Path | None = None


def note_claimed(folder: Path) -> None:
    """Say that the running job made ``folder`` for its artifacts: in a fork-server child, the caller removes it if the
    child dies without a result (killed at its timeout or memory limit, crashed). Elsewhere a no-op."""
    if _claims is not None:
        with contextlib.suppress(OSError), open(_claims, "a") as f:  # unsaid, a kill leaves it; the job still runs
            f.write(f"{folder}\n")


def claim_into(path: Path) -> None:
    """In a fork-server child, before its job runs: the file :func:`note_claimed` appends to."""
    global _claims
    _claims = path


T = TypeVar("T")

_PR_SET_PDEATHSIG = 1
# Held from a child's pipes to its fork and the parent's closing of the child's ends (see Parked).
_forking = threading.Lock()
_HEADER = struct.Struct("!cI")  # message type, payload length
_STEP, _RESULT, _RAISED, _PARKED = b"s", b"r", b"x", b"p"
# The result is in the child's answer file (start_forked), not in the message.
_RESULT_IN_FILE = b"f"
_ANSWERS = (_RESULT, _RESULT_IN_FILE, _RAISED)
# Where the child writes its reports; None in a process that is not such a child.
_report_fd: int | None = None
# In a child of start_parked: the pipe its parent's go comes through (see wait_for_go); None elsewhere.
_go_fd: int | None = None
# In such a child, once it parked and was let go on: it waits for the go pipe's end before it exits.
_parked = False
# In a fork-server job whose caller leases it the node for its benchmark (isolation.Lease): the file it asks
# in and the FIFO the grant comes through (see alone_on_node). None elsewhere: the job times where it is.
_lease_paths: tuple[Path, Path] | None = None


def set_lease_paths(paths: tuple[Path, Path] | None) -> None:
    """Called by the fork-server child before its job runs: where :func:`alone_on_node` asks and waits."""
    global _lease_paths
    _lease_paths = paths


def paused_path(ask: Path) -> Path:
    """The file a farm job's caller notes the job's pauses in (``farm.isolation``: stopped while its node's
    latency phase times others), one ``start end`` line (epoch seconds) each, beside the file it asks in."""
    return ask.with_suffix(".paused")


def unpaused_clock() -> float:
    """``time.perf_counter()`` less every second this farm job was paused so far: a clock that stops while the job is.

    A pause ends before the job can read the clock again (it is stopped meanwhile), so every window it has lived
    through is in the file. Outside a farm job, ``perf_counter`` itself."""
    return time.perf_counter() - sum(end - start for start, end in paused_windows(0.0))


def paused_windows(since: float) -> list[tuple[float, float]]:
    """The windows (epoch seconds) this job was paused in since ``since``, clipped to it; none outside a farm job."""
    if _lease_paths is None:
        return []
    try:
        lines = paused_path(_lease_paths[0]).read_text().split("\n")
    except OSError:
        return []
    found = []
    for line in lines:
        with contextlib.suppress(ValueError):
            start, end = (float(x) for x in line.split())
            if end > since:
                found.append((max(start, since), end))
    return found


@contextlib.contextmanager
def alone_on_node() -> Iterator[float]:
    """Hold the node's CPUs this job is timed on for the block: the farm's latency phase (yields the seconds waited).

    In a farm job, the job asks its caller (a file), which takes the node's benchmark lease
    (``farm``: no conversion runs on the node meanwhile; other benchmarks only on other CPUs, the
    job's processes pinned to its own before the grant) and grants it through a FIFO this process
    blocks on, using no CPU while others are timed; leaving the block frees its CPUs again, and
    waits on the FIFO until the caller says the node's phase is over.
    Outside such a job (``convert``, a test) a no-op.
    """
    if _lease_paths is None:
        yield 0.0
        return
    ask, grant = _lease_paths
    t0 = time.monotonic()
    ask.write_text("ask")
    with open(grant, "rb") as fifo:  # blocks until the caller opens it for writing: the grant
        fifo.read(1)
    waited = time.monotonic() - t0
    try:
        yield waited
    finally:
        with contextlib.suppress(OSError):
            ask.write_text("free")
            # On once the node's phase is over: what the job does next would disturb the other lanes' timing.
            with open(grant, "rb") as fifo:
                fifo.read(1)


def grant(fifo: Path) -> bool:
    """The caller's side of :func:`alone_on_node`: grant the lease; False while the job is not yet waiting on the FIFO."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader yet: it asked, and has not reached open()
            return False
        raise
    try:
        os.write(fd, b"!")
    finally:
        os.close(fd)
    return True


def run_forked(fn: Callable[[], T], *, timeout_s: float) -> T:
    """``fn()`` in a forked child: its return value (pickled back), or what it raised, re-raised here.

    A child killed by a signal or past ``timeout_s`` raises OptimizeError naming the
    last :func:`step` it reported ("ONNX Runtime crashed (signal 11) loading model_fp16.onnx").
    A :class:`Parked` child that never parks.
    """
    return Parked(fn, timeout_s=timeout_s).result()


def start_forked(fn: Callable[[], T], *, timeout_s: float) -> Parked[T]:
    """``fn()`` in a forked child started now, while the caller goes on: ``.result()`` waits for it (up to ``timeout_s``
    from then) and answers as :func:`run_forked`; ``.close()`` kills one whose result nobody asked for.

    The export stage fixes a graph's dynamic axes this way while it exports the next graph. Fork from the thread that
    runs torch, between two of its calls, never beside one: the child inherits no lock a torch op holds.
    """
    return Parked(fn, timeout_s=timeout_s, wait=False)


def _answer(messages: list[tuple[bytes, bytes]], status: int | None, timeout_s: float, answer: BinaryIO | None) -> Any:
    """What the child's messages say: its result, what it raised re-raised, or how it died (OptimizeError)."""
    last_step = next((body for kind, body in reversed(messages) if kind == _STEP), None)
    for kind, body in messages:
        if kind == _RESULT:
            return pickle.loads(body)
        if kind == _RESULT_IN_FILE and answer is not None:
            answer.seek(0)
            return pickle.load(answer)
        if kind == _RAISED:
            raise _reraised(pickle.loads(body))
    doing = pickle.loads(last_step) if last_step is not None else ("the child", "starting")
    if status is None:
        raise OptimizeError(f"{doing[0]} did not finish {doing[1]} within {timeout_s:g} s")
    if os.WIFSIGNALED(status):
        raise OptimizeError(f"{doing[0]} crashed (signal {os.WTERMSIG(status)}) {doing[1]}")
    raise OptimizeError(f"{doing[0]} exited with status {os.WEXITSTATUS(status)} {doing[1]}")


class Parked(Generic[T]):
    """``fn()`` in a forked child, its result or its failure brought back, and the child may stop half-way to wait
    for its parent (:func:`wait_for_go`); :func:`run_forked` is one that never does.

    The deployment targets' checks run this way: a child loads a variant's graphs and checks them
    beside the node's conversions, then parks with its sessions open until the job's latency
    phase, where :meth:`result` lets it time its calls and finish: no runtime is loaded twice.
    Made, it waits until the child parks, finishes, or passes ``timeout_s``; :meth:`result`
    waits again up to ``timeout_s``. A child that parked answers and then waits for :meth:`close`
    before it exits: its exit (the kernel tearing down its copy of the job's address space, 15-20 ms for
    a child of a warm fork-server job that allocated nothing, and what its runtime allocated) is work the
    latency phase's timings would share the CPU with, so the job closes its parked children once its
    phase is over. :meth:`close` kills a child nobody asked for its result.
    """

    def __init__(self, fn: Callable[[], T], *, timeout_s: float, wait: bool = True) -> None:
        import onnxruntime  # noqa: F401 - imported before the fork, so no child pays for it (nor imports under a fork)

        sys.stdout.flush()
        sys.stderr.flush()
        self.timeout_s = timeout_s
        # Not waited for (start_forked), its result goes to a file of its own: in the pipe, a result bigger than
        # the pipe holds would keep the child alive, and its memory with it, until the caller reads it after what
        # it runs beside (a thread reading for it would wait for the GIL the caller's C++ holds): the references
        # computed beside gpt2's export, 0.33 GB of its own, past the export's peak.
        self._answer = None if wait else tempfile.TemporaryFile(prefix="zoo-convert-answer-")
        # Another thread's fork must not inherit this child's write end between fork and close (the optimize stage
        # makes variants in several threads): the parent would read no end of this child's reports until that
        # other child exited too.
        with _forking:
            read, write = os.pipe()
            go_read, go_write = os.pipe()
            self.pid = os.fork()
            if self.pid != 0:
                os.close(write)
                os.close(go_read)
        if self.pid == 0:
            global _go_fd
            os.close(read)
            os.close(go_write)
            _go_fd = go_read
            _child(fn, write, self._answer)
        # Not waited for (start_forked): as good as parked, it runs on until result() collects it.
        buffer, state = _until_parked(self.pid, read, timeout_s) if wait else (b"", "parked")
        self.parked = state == "parked"
        self._pipes: tuple[int, int] | None = (read, go_write)
        self._buffer = buffer
        self._messages: list[tuple[bytes, bytes]] = []
        self._status: int | None = None
        self.answered = False  # parked, it answered and waits to be let go (close)
        self._unreaped = False
        if not self.parked:  # it finished, died, or was killed at the timeout: nothing to wait for
            self._close_pipes()
            _, status = os.waitpid(self.pid, 0)
            self._messages, self._status = _split(buffer), None if state == "killed" else status

    def result(self) -> T:
        """Let a parked child go on; then what it returned, re-raised what it raised, or how it died.

        A parked child that answered is still alive, waiting for :meth:`close` to exit."""
        if self._pipes is not None and not self.answered:
            read, go = self._pipes
            with contextlib.suppress(OSError):
                os.write(go, b"g")
            messages, self._status = _collect(self.pid, read, self.timeout_s)
            self._messages = _split(self._buffer) + messages
            self.answered = _answered(self._messages)
            if not self.answered:  # it died, or was killed at the timeout (_collect reaped it)
                self._close_pipes()
        result: T = _answer(self._messages, self._status, self.timeout_s, self._answer)
        return result

    def close(self) -> None:
        """Let a child that answered exit, or kill one still parked (its result unasked: a job that failed leaves no
        runtime behind); then reap it."""
        self.let_go()
        self.reap()

    def let_go(self) -> None:
        """:meth:`close`'s first half, for closing several children at once (their exits run side by side)."""
        if self._pipes is not None:
            if not self.answered:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
            self._close_pipes()  # an answered child reads the end of its go pipe and exits
            self._unreaped = True
        if self._answer is not None:
            self._answer.close()

    def reap(self) -> None:
        """:meth:`close`'s second half: wait for the child let go to be gone."""
        if self._unreaped:
            self._unreaped = False
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)

    def _close_pipes(self) -> None:
        if self._pipes is not None:
            for fd in self._pipes:
                os.close(fd)
            self._pipes = None


def wait_for_go() -> None:
    """In a :class:`Parked` child: tell the parent it is ready, and block until it says go. Elsewhere a no-op.

    A parent that closed the pipe without saying go (it failed, or was killed) ends the child here."""
    global _parked
    if _go_fd is None or _report_fd is None:
        return
    _send(_report_fd, _PARKED, b"")
    if os.read(_go_fd, 1) != b"g":
        os._exit(0)
    _parked = True


def _until_parked(pid: int, fd: int, timeout_s: float) -> tuple[bytes, str]:
    """The child's messages until it parks ("parked"), closes its end ("closed") or is killed at ``timeout_s`` ("killed").

    Read as they come (a big result must not fill the pipe); only the headers are looked at on the way.
    """
    deadline = time.monotonic() + timeout_s
    buffer = bytearray()
    at = 0  # where the next message's header starts
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            return bytes(buffer), "killed"
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return bytes(buffer), "closed"
        buffer += chunk
        while at + _HEADER.size <= len(buffer):
            kind, size = _HEADER.unpack_from(buffer, at)
            if kind == _PARKED:
                return bytes(buffer), "parked"
            at += _HEADER.size + size


def step(actor: str, doing: str) -> None:
    """Say what the child does now (``step("ONNX Runtime", "loading model_fp16.onnx")``); a no-op outside a child."""
    if _report_fd is not None:
        _send(_report_fd, _STEP, pickle.dumps((actor, doing)))


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent goes (a killed job takes its children along)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass


def _child(fn: Callable[[], T], write: int, answer: BinaryIO | None) -> None:
    global _report_fd
    # Never collect what the parent left: an inherited ONNX Runtime session (or a torch object)
    # in a garbage cycle would be destroyed here, waiting forever on thread-pool condition
    # variables whose threads did not cross the fork (seen: a session collected mid-import).
    gc.freeze()
    _report_fd = write
    die_with_parent()
    try:
        try:
            result = fn()
            if answer is None:
                _send(write, _RESULT, pickle.dumps(result))
            else:
                pickle.dump(result, answer)
                answer.flush()
                _send(write, _RESULT_IN_FILE, b"")
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            _send(write, _RAISED, pickle.dumps(_described(exc)))
        sys.stdout.flush()
        sys.stderr.flush()
        if _parked and _go_fd is not None:
            os.read(_go_fd, 1)  # exit once the parent lets go (Parked.close): not in its job's latency phase
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _described(exc: BaseException) -> dict[str, object]:
    """What the parent needs to raise the same failure: kind, one line, the traceback, a storage errno."""
    fault = storage_fault(exc)
    if fault is not None:
        return {"errno": fault.errno, "message": str(fault.strerror or fault)}
    kind = exc.kind if isinstance(exc, ZooConvertError) else FailureKind.INTERNAL if is_our_bug(exc) else None
    return {
        "kind": kind.value if kind is not None else None,
        "message": first_line(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


def _reraised(described: dict[str, object]) -> BaseException:
    if "errno" in described:
        return OSError(described["errno"], described["message"])
    kind = described["kind"]
    return ForkedError(
        str(described["message"]),
        kind=FailureKind(kind) if isinstance(kind, str) else None,
        traceback_text=str(described["traceback"]),
    )


def _send(fd: int, kind: bytes, body: bytes) -> None:
    data = _HEADER.pack(kind, len(body)) + body
    while data:
        data = data[os.write(fd, data) :]


def _collect(pid: int, fd: int, timeout_s: float) -> tuple[list[tuple[bytes, bytes]], int | None]:
    """The child's messages, read as they come (a big result must not fill the pipe), until its answer (its result or
    what it raised: the child is left alive, unreaped, status None) or its end (it died: reaped, its wait status;
    None when it was killed at the timeout). ``fd`` stays open.
    """
    deadline = time.monotonic() + timeout_s
    buffer = bytearray()
    at = 0  # where the next message's header starts: only headers are looked at on the way, each once
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return _split(bytes(buffer)), None
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:  # the child closed its end: it exited or died
            break
        buffer += chunk
        while at + _HEADER.size <= len(buffer):
            kind, size = _HEADER.unpack_from(buffer, at)
            if at + _HEADER.size + size > len(buffer):
                break  # its body is still coming
            if kind in _ANSWERS:
                return _split(bytes(buffer)), None
            at += _HEADER.size + size
    _, status = os.waitpid(pid, 0)
    return _split(bytes(buffer)), status


def _answered(messages: list[tuple[bytes, bytes]]) -> bool:
    return any(kind in _ANSWERS for kind, _ in messages)


def _split(buffer: bytes) -> list[tuple[bytes, bytes]]:
    messages = []
    at = 0
    while at + _HEADER.size <= len(buffer):
        kind, size = _HEADER.unpack_from(buffer, at)
        body = buffer[at + _HEADER.size : at + _HEADER.size + size]
        if len(body) < size:
            break  # cut short by a crash
        messages.append((kind, body))
        at += _HEADER.size + size
    return messages

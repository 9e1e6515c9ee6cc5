"""Failure taxonomy and the exception tree.

Every failure the farm records carries a :class:`FailureKind`. Kinds are prefixed
with the stage that raises them, so the DB, the dashboard and the logs speak the
same words::

    ZooConvertError                 (kind: internal)
     ├── UsageError                 bad CLI input, never recorded (exit 2)
     ├── ManifestError              manifest_error        (carries row, column)
     ├── FetchError                 fetch_error, fetch_not_found, fetch_transient
     ├── UnsafeCheckpointError      fetch_unsafe          (pickle-only, remote code, bad id, FIFO/device)
     ├── OutputDirError             storage_error         (the artifact folder cannot be made)
     ├── ExportError                export_error, export_unsupported, export_weights_mismatch
     ├── CheckError                 check_error
     ├── OptimizeError              optimize_error
     │    ├── QuantizeError         a graph quantize.py cannot write (opset, size, unsafe data path)
     │    └── ForkedError           what a forked child raised (forked.py), with its kind and traceback
     ├── VerifyError                verify_error, verify_numerics
     │    └── NumericsMismatchError verify_numerics (GenerationMismatchError: greedy tokens diverged)
     ├── BenchmarkError             benchmark_error
 ├── TargetError                a deployment target's own error (targets/): a target row's message, never a job's kind
 │    ├── TargetUnsupported     the runtime has no code for the model (``unsupported``)
 │    └── TargetNotRun          not installed, no device, or it would run elsewhere (``not-run``)
     ├── PublishError               publish_error
     │    └── HubUnreachableError   the Hub's endpoint refuses connections or its host has no address (stops a publish)
     ├── StoreError                 the results DB is locked, missing or misused (never recorded)
     │    └── RunLockedError        another run holds the DB's run lock
     ├── MachineFaultError          a run stopped early: every job met the same machine fault (exit 1)
     └── UnsafeForkServerError      the fork server's folder or socket is not this user's (stops the run)

A pipeline stage raises one of these; ``pipeline.convert_one`` turns any
exception into a recorded result. Anything not in this tree is a bug of ours and
is recorded as ``internal`` with its traceback. A stage relabels what the
toolchain (torch, optimum, onnxruntime) raises as its own kind, but never what
zoo_convert's own code raised (:func:`is_our_bug`): that stays ``internal``.
Jobs that hang, crash, run out of memory or lose their worker produce no
exception: isolation and the farm record ``timeout``, ``crash``, ``oom`` and
``worker_lost`` results for them, and ``gpu_unavailable`` for a gpu row on a
cluster without GPUs. An ``OSError`` of a full disk, a quota, a read-only or
failing file system while writing artifacts (:func:`storage_fault`) is
``storage_error``, wherever it was raised.

Kinds are transient (the farm retries the job within the run: ``fetch_transient``,
``oom``, ``worker_lost``, ``storage_error``) and terminal (a recorded result answers
its job, so later runs skip it); ``storage_error``, ``worker_lost`` and
``gpu_unavailable`` are not terminal: they are the machine's fault (a full or failing
disk, an unusable output folder, a lost worker or node, no GPU), so the next run redoes
the job without ``--retry-failed``. A run in which every job meets the same fault of
the machine stops early (:class:`MachineFaultError` is what the CLI then says).
"""

from __future__ import annotations

import errno
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .checks import OutputCheck, Tolerance

_PACKAGE = Path(__file__).resolve().parent
# A message longer than this is cut: the record keeps the traceback in full.
MESSAGE_LIMIT = 1000
# How a verify_numerics message starts when only the long verify shape failed: a graph
# right for short inputs only, apart from a wrong one (``message LIKE 'long inputs only:%'``).
LONG_INPUTS_ONLY = "long inputs only"
# How the verify_numerics message of a variant starts when its own checks passed but its fp32
# sibling, made from the same export, failed: one export, one structural verdict.
STRUCTURE_FAILED = "fp32 of the same export failed verification"


class FailureKind(str, Enum):
    """What went wrong, as stored in the DB; the prefix names the stage."""

    MANIFEST_ERROR = "manifest_error"
    FETCH_ERROR = "fetch_error"
    FETCH_NOT_FOUND = "fetch_not_found"
    FETCH_TRANSIENT = "fetch_transient"
    FETCH_UNSAFE = "fetch_unsafe"
    EXPORT_UNSUPPORTED = "export_unsupported"
    EXPORT_ERROR = "export_error"
    # The checkpoint's weights do not cover the model exported from it (missing, unused or
    # mismatched tensors): the graph would verify against whatever transformers initialised.
    EXPORT_WEIGHTS_MISMATCH = "export_weights_mismatch"
    CHECK_ERROR = "check_error"
    OPTIMIZE_ERROR = "optimize_error"
    VERIFY_ERROR = "verify_error"
    VERIFY_NUMERICS = "verify_numerics"
    BENCHMARK_ERROR = "benchmark_error"
    PUBLISH_ERROR = "publish_error"
    TIMEOUT = "timeout"
    CRASH = "crash"
    OOM = "oom"
    WORKER_LOST = "worker_lost"
    STORAGE_ERROR = "storage_error"
    GPU_UNAVAILABLE = "gpu_unavailable"
    INTERNAL = "internal"

    @property
    def transient(self) -> bool:
        """Worth retrying: the same job may succeed on another attempt."""
        return self in _TRANSIENT

    @property
    def terminal(self) -> bool:
        """A recorded result of this kind answers its job for good: later runs skip the job."""
        return self not in _REDONE

    @property
    def stage(self) -> str:
        return _STAGE_OF.get(self, "job")

    def __str__(self) -> str:
        return self.value


_TRANSIENT = {FailureKind.FETCH_TRANSIENT, FailureKind.OOM, FailureKind.WORKER_LOST, FailureKind.STORAGE_ERROR}
# The machine's fault, not the model's: recorded, and redone by the next run.
_REDONE = {FailureKind.STORAGE_ERROR, FailureKind.WORKER_LOST, FailureKind.GPU_UNAVAILABLE}
_STAGE_OF = {k: k.value.split("_", 1)[0] for k in FailureKind if "_" in k.value}
_STAGE_OF[FailureKind.MANIFEST_ERROR] = "manifest"
for _kind in (FailureKind.WORKER_LOST, FailureKind.STORAGE_ERROR, FailureKind.GPU_UNAVAILABLE, FailureKind.INTERNAL):
    _STAGE_OF[_kind] = "job"

_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def storage_fault(exc: BaseException) -> OSError | None:
    """The OSError of a full disk, quota, read-only or failing file system behind ``exc``, if any.

    Looks down the cause chain: a stage wraps what its library raised in its own error.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError) and cur.errno in _STORAGE_ERRNOS:
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


class ZooConvertError(Exception):
    """Base of every error zoo_convert raises on purpose."""

    kind: FailureKind = FailureKind.INTERNAL

    def __init__(self, message: str, *, kind: FailureKind | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class UsageError(ZooConvertError):
    """Bad command-line input; reported, never recorded."""


class ManifestError(ZooConvertError):
    """A manifest file or row is invalid."""

    kind = FailureKind.MANIFEST_ERROR

    def __init__(self, message: str, *, row: int | None = None, column: str | None = None) -> None:
        where = f"row {row}: " if row is not None else ""
        super().__init__(where + message)
        self.row = row
        self.column = column
        self.reason = message


class FetchError(ZooConvertError):
    kind = FailureKind.FETCH_ERROR


class UnsafeCheckpointError(FetchError):
    """The checkpoint needs permission it was not given (pickle weights, remote code)."""

    kind = FailureKind.FETCH_UNSAFE


class ExportError(ZooConvertError):
    kind = FailureKind.EXPORT_ERROR


class OutputDirError(ZooConvertError):
    """The job's artifact folder cannot be made (``--out`` under /proc or a file, no permission): the machine's fault."""

    kind = FailureKind.STORAGE_ERROR


class CheckError(ZooConvertError):
    kind = FailureKind.CHECK_ERROR


class OptimizeError(ZooConvertError):
    kind = FailureKind.OPTIMIZE_ERROR


class QuantizeError(OptimizeError):
    """A graph ``zoo_convert.variants.quantize`` cannot write: opset too old, output over the protobuf limit, unsafe data path."""


class ForkedError(OptimizeError):
    """An exception raised in a forked child (:mod:`zoo_convert.stages.forked`), raised again in the job's process.

    Attributes:
        traceback_text: the child's traceback, where the failure happened (the record keeps it).
    """

    def __init__(self, message: str, *, kind: FailureKind | None = None, traceback_text: str = "") -> None:
        super().__init__(message, kind=kind)
        self.traceback_text = traceback_text


class VerifyError(ZooConvertError):
    kind = FailureKind.VERIFY_ERROR


class TargetError(ZooConvertError):
    """A deployment target could not load or run a variant (its own message); recorded on the target's row only."""

    kind = FailureKind.VERIFY_ERROR


class TargetUnsupported(TargetError):
    """The runtime has no implementation for this model (an architecture it does not know)."""


class TargetNotRun(TargetError):
    """The target cannot run here: not installed, no device, or it would silently run elsewhere."""


class NumericsMismatchError(VerifyError):
    """ONNX Runtime and PyTorch disagree beyond the variant's tolerance.

    Attributes:
        worst: the failing output check with the largest error (output, input shape, numbers).
        tolerance: the variant's pass criteria it missed.
        checks: every output check of the variant, passed or not, for the record.
        long_only: where it diverged (``1x128 (batch x tokens)``) when every short shape
            passed and only the long one failed; the message then starts with LONG_INPUTS_ONLY.
        note: appended to the message: why the variant could not meet it, where that is known.
    """

    kind = FailureKind.VERIFY_NUMERICS

    def __init__(
        self,
        *,
        worst: OutputCheck,
        tolerance: Tolerance,
        checks: tuple[OutputCheck, ...],
        long_only: str | None = None,
        note: str = "",
    ) -> None:
        failed = sum(not c.passed for c in checks)
        where = f"{LONG_INPUTS_ONLY}: the short shapes passed, diverged at {long_only}; " if long_only else ""
        used = f" at {worst.bound_used:.3g} times its bound" if worst.bound_used > 1 else ""
        numbers = (
            f"max abs {worst.max_abs:.3g} (tolerance {tolerance.describe()}){used}, cosine {worst.cosine:.6f} "
            f"(min {tolerance.min_cosine:g}), nan {worst.nan}, inf {worst.inf}"
        )
        super().__init__(
            f"{where}{failed}/{len(checks)} output checks failed; worst {worst.output} at {worst.shape}: "
            f"{worst.mismatch or numbers}{note}"
        )
        self.worst = worst
        self.tolerance = tolerance
        self.checks = checks
        self.long_only = long_only


class GenerationMismatchError(NumericsMismatchError):
    """Every generation step's logits met the tolerance, yet ONNX Runtime's own greedy tokens are not PyTorch's.

    Attributes (besides NumericsMismatchError's; ``worst`` is the logits check of the step that diverged):
        token_match: share of ORT's greedy tokens identical to PyTorch ``generate()``'s.
        first_mismatch: the first step whose token differs.
    """

    def __init__(
        self, *, worst: OutputCheck, tolerance: Tolerance, checks: tuple[OutputCheck, ...], token_match: float,
        first_mismatch: int, steps: int,
    ) -> None:  # fmt: skip
        VerifyError.__init__(
            self,
            f"greedy generation diverged from PyTorch generate() at step {first_mismatch} of {steps}:"
            f" {token_match:.0%} of tokens identical, every step's logits within tolerance"
            f" (worst at {worst.shape}: max abs {worst.max_abs:.3g}, tolerance {tolerance.describe()})",
        )
        self.worst = worst
        self.tolerance = tolerance
        self.checks = checks
        self.long_only = None
        self.token_match = token_match
        self.first_mismatch = first_mismatch


class BenchmarkError(ZooConvertError):
    kind = FailureKind.BENCHMARK_ERROR


class PublishError(ZooConvertError):
    kind = FailureKind.PUBLISH_ERROR


class HubUnreachableError(PublishError):
    """The Hub cannot be reached at all (connection refused, no DNS answer, no route): nothing else is tried.

    Attributes:
        endpoint: the Hub URL that was tried.
        reason: what the network said, in a few words.
    """

    def __init__(self, message: str, *, endpoint: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint  # optional: unpickling calls the class with the message alone
        self.reason = reason


class StoreError(ZooConvertError):
    """The results database cannot be opened or was asked to do something wrong."""


class RunLockedError(StoreError):
    """Another farm run holds the database's run lock (one run per database at a time)."""

    def __init__(self, message: str, *, holder: str | None = None) -> None:
        super().__init__(message)
        self.holder = holder  # "run <id> (host <h>, pid <n>, since <t>)"


class MachineFaultError(ZooConvertError):
    """A run stopped early: every job it ran met the same fault of the machine (full disk, lost workers).

    Nothing more is recorded as the models' verdict; the jobs left are the next run's.
    """


class UnsafeForkServerError(ZooConvertError):
    """The fork server's folder or the process listening on its socket is not this user's own.

    Requests carry the caller's environment (tokens included) and pickled code, so the
    run stops before any job; this is never recorded as a model's failure.
    """

    def __init__(self, message: str, *, folder: str | None = None) -> None:
        super().__init__(message)
        self.folder = folder  # optional: unpickling calls the class with the message alone


def first_line(exc: BaseException) -> str:
    """What went wrong in one line: the first line of the message, after the type unless the error is ours."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    if not isinstance(exc, ZooConvertError):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    text = text or type(exc).__name__
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + " ..."


# C0 and C1 controls and DEL: in a name or message they could move the cursor, set a terminal's
# title (OSC) or forge a line of output. Escaped, not dropped: the name stays recognisable.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)} | {c: f"\\u{c:04x}" for c in range(0x80, 0xA0)}


def printable(text: str, limit: int | None = None) -> str:
    """``text`` for a terminal or a log: control characters (newlines too) escaped, cut at ``limit`` characters."""
    shown = text.translate(_CONTROLS)
    return shown if limit is None or len(shown) <= limit else shown[: limit - 3] + "..."


def is_our_bug(exc: BaseException) -> bool:
    """Whether ``exc`` is a bug of ours (``internal``): not one of our errors, raised in zoo_convert's own code."""
    if isinstance(exc, ZooConvertError):
        return False
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE)

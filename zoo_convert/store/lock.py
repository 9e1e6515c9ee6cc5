"""One farm run per results database: an exclusive lock file beside it.

``<db>.lock`` is held with ``flock`` for the whole of a run. The kernel lets go of
it when the holder's process ends, however it ends (SIGKILL included), so a lock
whose holder is gone is simply taken by the next run; nothing needs clearing by
hand. While held, the file says who holds it (run id, host, pid, since), so a
second run can say whom it is waiting for.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

from ..errors import RunLockedError, StoreError


def lock_path(db_path: str | Path) -> Path:
    """The lock file of a results database."""
    return Path(f"{db_path}.lock")


@contextlib.contextmanager
def run_lock(
    db_path: str | Path, run_id: str, *, wait: bool = False, waiting: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold the database's run lock for the block; RunLockedError when another run has it (unless ``wait``)."""
    path = lock_path(db_path)
    folder = next(p for p in (path.parent, *path.parent.parents) if p.exists())
    if not folder.is_dir():
        raise StoreError(f"{db_path}: {folder} is a file, not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:  # a read-only file system, a --db under a file, no permission
        raise StoreError(f"{db_path}: cannot make its run lock {path}: {exc.strerror or exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(path)
            if not wait:
                raise RunLockedError(
                    f"{db_path} is in use by {holder}; let it finish, or pass --wait to start after it", holder=holder
                ) from None
            if waiting is not None:
                waiting(f"{db_path} is in use by {holder}; waiting for it to finish")
            fcntl.flock(fd, fcntl.LOCK_EX)
        since = datetime.now(timezone.utc).isoformat(timespec="seconds")
        record = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), "since": since}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # before letting go: nobody reads a finished run as the holder
    finally:
        os.close(fd)


def _holder(path: Path) -> str:
    """Who holds the lock, in words (empty while a new holder has not written its record yet)."""
    try:
        h = json.loads(path.read_text())
        return f"run {h['run_id']} (host {h['host']}, pid {h['pid']}, since {h['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another run (it has not said which yet)"

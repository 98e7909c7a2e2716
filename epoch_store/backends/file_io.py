"""Blocking file primitives of the file epoch store: crash-safe replace, an inter-process lock
with a deadline, bounded reads. Everything here blocks; callers run it on worker threads, never
on the event loop.

Crash safety: a new object is written to a temp file, fsynced, renamed over the old one and the
directory is fsynced, so readers (who take no lock) see the old or the new object, never a mix.
The temp file has a fixed name per object and is only written under the log's lock, so a torn
temp file left by a crash is simply truncated by the next writer and never read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from shared.durable_files import fsync_dir

LOCK_POLL_MS_MIN = 0.2
LOCK_POLL_MS_MAX = 5.0
"""Polling bounds while another process holds a log's lock (flock has no timeout of its own)."""


def ensure_dir(path: str) -> None:
    """Create ``path`` and missing ancestors, fsyncing each parent that gained an entry."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path:
        ensure_dir(parent)
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        return
    fsync_dir(parent or ".")


def read_bytes(path: str, bytes_max: int) -> bytes | None:
    """Up to ``bytes_max + 1`` bytes of ``path`` (so callers can see it is too big), or None
    when the file does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read(bytes_max + 1)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def exclusive_lock(lock_path: str, timeout_ms: int) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if missing) for the ``with`` body;
    yields False, without the lock, if it could not be taken within ``timeout_ms``. The lock is
    per open file description, so it also excludes other threads of this process."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        yield acquire_flock(fd, fcntl.LOCK_EX, timeout_ms)
    finally:
        # Closing the descriptor releases the lock.
        os.close(fd)


def acquire_flock(fd: int, operation: int, timeout_ms: int) -> bool:
    """Take ``flock(fd, operation)`` (LOCK_EX or LOCK_SH), polling with backoff for at most
    ``timeout_ms``; False if it could not be taken."""
    deadline_s = time.monotonic() + timeout_ms / 1000
    poll_ms = LOCK_POLL_MS_MIN
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        remaining_s = deadline_s - time.monotonic()
        if remaining_s <= 0:
            return False
        time.sleep(min(poll_ms / 1000, remaining_s))
        poll_ms = min(poll_ms * 2, LOCK_POLL_MS_MAX)

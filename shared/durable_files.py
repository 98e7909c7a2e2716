"""Small files replaced durably (write a temporary, fsync, rename, fsync the directory): the
epoch store's file backends, the cluster state file, a storage node's disk marker and its
authority status all keep their state this way."""

from __future__ import annotations

import os


def fsync_dir(path: str) -> None:
    """Make a directory's entries (a rename, a new child) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_atomically(path: str, data: bytes, tmp_path: str | None = None) -> None:
    """Replace ``path`` by ``data`` durably: a reader sees the old file or the new one, never
    a mix, and after a crash the new one if this returned. The caller must be the only
    writer of ``tmp_path`` (default ``path + ".tmp"``). Raises OSError if it cannot."""
    temporary = path + ".tmp" if tmp_path is None else tmp_path
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fsync_dir(os.path.dirname(path) or ".")

"""Keep big buffers in the heap: glibc malloc settings for processes that move batches.

glibc serves an allocation of 128 KiB or more (its starting ``M_MMAP_THRESHOLD``) with a fresh
``mmap`` and gives it back with ``munmap`` when freed, and trims the heap top past
``M_TRIM_THRESHOLD``. Every 256 KiB batch a node receives, joins, packs or unpacks is such an
allocation, so each one page-faults all of its pages in again: on this project's 2-core VM,
receiving one 256 KiB frame cost 237 us of CPU that way against 19 us with the settings below
(most of a storage node's per-record Python time for a buffered writer's batches). Raising both
thresholds keeps freed batch buffers in the heap for the next batch, at the price of up to
``trim_threshold_bytes`` of free memory the process keeps instead of returning it.

``tune()`` is called once at start by the node process (``services.node``) and by the load
generators; an application using ``seqlog``'s buffered writer for bulk writes may call it too.
It does nothing where glibc's ``mallopt`` is not available (another libc, another OS).
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter numbers (``malloc.h``)."""

MMAP_THRESHOLD_BYTES = 16 * 1024 * 1024
"""Allocations below this come from the heap (glibc caps the setting at 32 MiB)."""
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024
"""Free memory at the heap top kept for reuse before it is given back to the OS."""


def tune(mmap_threshold_bytes: int = MMAP_THRESHOLD_BYTES,
         trim_threshold_bytes: int = TRIM_THRESHOLD_BYTES) -> bool:
    """Apply the settings; True if glibc took both."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold_bytes) == 1
                and mallopt(M_TRIM_THRESHOLD, trim_threshold_bytes) == 1)

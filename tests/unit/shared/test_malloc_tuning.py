"""glibc malloc tuning: big batch buffers are reused from the heap, not faulted in anew."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = """
import os, resource, sys
if sys.argv[1] == "tune":
    from shared import malloc_tuning
    assert malloc_tuning.tune()
frame = os.urandom(256 * 1024)
for _ in range(20):  # warm up: let the heap reach its working size
    bytes(bytearray(frame))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):
    bytes(bytearray(frame))
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], check=True, timeout=60,
                         capture_output=True, text=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_batch_sized_buffers_stop_page_faulting_once_tuned() -> None:
    # 200 rounds of two 256 KiB buffers: untuned, each one is a fresh mmap (64 faults each).
    untuned = _faults("default")
    tuned = _faults("tune")
    assert untuned > 200 * 64
    assert tuned < 200

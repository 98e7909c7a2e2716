"""What happened in a run: the last lines (printed when a checker fires) and a digest of every
line (two runs of one seed must produce the same digest, or the run is not deterministic)."""

from __future__ import annotations

import hashlib
import sys
from collections import deque

TRACE_LINES_MAX = 400
"""Lines kept for the failure report; the digest still covers every line."""


class Trace:
    def __init__(self, *, verbose: bool = False) -> None:
        self.verbose = verbose
        self.lines: deque[str] = deque(maxlen=TRACE_LINES_MAX)
        self._digest = hashlib.sha256()
        self.lines_count = 0

    def log(self, now_ms: int, text: str) -> None:
        line = f"{now_ms:>8}ms {text}"
        self.lines.append(line)
        self._digest.update(line.encode())
        self.lines_count += 1
        if self.verbose:
            print(line, file=sys.stderr)

    def digest(self) -> str:
        return self._digest.hexdigest()

    def tail(self, lines_max: int = 60) -> str:
        return "\n".join(list(self.lines)[-lines_max:])

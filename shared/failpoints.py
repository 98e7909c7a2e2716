"""Named failpoints for fault-injection tests: places in the code where a test can make the
process die exactly as ``kill -9`` would, at a chosen moment of a protocol.

A process is armed once, from the environment, when this module is first imported::

    SEQLOG_FAILPOINTS="storage.after_write_before_fsync=crash@3,sequencer.after_epoch_bump=crash"

``name=crash@N`` sends the process SIGKILL the Nth time the code passes ``hit(name)``
(``crash`` alone means ``crash@1``). Only names listed in ``KNOWN`` may be armed; anything else
(an unknown name, action or count) raises ``FailpointError`` at arm time, so a typo in a test
fails loudly at start-up instead of silently never firing.

``hit(name)`` sits on hot paths: when nothing is armed it is one lookup in an empty mapping.
The count is kept per process (a restarted process starts again from zero) and is safe to bump
from several threads (the storage writer thread hits one of them).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

ENV_VAR: Final = "SEQLOG_FAILPOINTS"

KNOWN: Final[Mapping[str, str]] = MappingProxyType({
    "appender.after_k_stores":
        "an appender, each time it receives STORED OK for a copy (crash@k: after k of R stores)",
    "sequencer.after_epoch_bump":
        "a sequencer, after the epoch store gave it a new epoch and before recovery's SEAL",
    "recovery.after_seal":
        "epoch recovery, after an f-majority sealed and before its mutations and the bridge",
    "storage.after_write_before_fsync":
        "a storage node, after a batch's write() and before its fsync (fsync=always batches)",
    "storage.reclaim_after_checkpoint":
        "a storage node's disk reclaim, after its checkpoint is fsynced and before any segment "
        "is deleted or compacted",
    "storage.compact_before_rename":
        "a storage node's compaction, after the compacted copy is fsynced and before it is "
        "renamed over the segment",
})
"""Every failpoint the code may hit, with where it sits. Add a name here before using it."""

ACTIONS: Final = ("crash",)
HIT_COUNT_MAX: Final = 1_000_000
"""Largest N of ``crash@N``; more is surely a mistake in the test."""


class FailpointError(ValueError):
    """A failpoint spec names an unknown failpoint or action, or a bad count."""


@dataclass(frozen=True, slots=True)
class Arm:
    """One armed failpoint: do ``action`` on hit number ``at_hit`` (1-based)."""

    name: str
    action: str = "crash"
    at_hit: int = 1

    def spec(self) -> str:
        return f"{self.name}={self.action}@{self.at_hit}"


def parse(spec: str) -> tuple[Arm, ...]:
    """The failpoints a ``SEQLOG_FAILPOINTS`` value arms; raises ``FailpointError``."""
    arms: dict[str, Arm] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, action_text = item.partition("=")
        name = name.strip()
        if name not in KNOWN:
            raise FailpointError(
                f"unknown failpoint {name!r} in {ENV_VAR}; known: {', '.join(sorted(KNOWN))}")
        if not sep:
            raise FailpointError(f"failpoint {name!r} needs an action, e.g. {name}=crash@2")
        action, at, count_text = action_text.strip().partition("@")
        if action not in ACTIONS:
            raise FailpointError(f"failpoint {name!r}: unknown action {action!r}; "
                                 f"known: {', '.join(ACTIONS)}")
        try:
            at_hit = int(count_text) if at else 1
        except ValueError:
            raise FailpointError(f"failpoint {name!r}: bad hit count {count_text!r}") from None
        if not 1 <= at_hit <= HIT_COUNT_MAX:
            raise FailpointError(f"failpoint {name!r}: hit count {at_hit} is outside "
                                 f"[1, {HIT_COUNT_MAX}]")
        if name in arms:
            raise FailpointError(f"failpoint {name!r} is armed twice")
        arms[name] = Arm(name, action, at_hit)
    return tuple(arms.values())


def _sigkill(arm: Arm, hits_count: int) -> None:
    # Straight to fd 2 (node.log): buffered logging would die with the process.
    os.write(2, f"failpoint {arm.name} hit {hits_count}: SIGKILL (armed {arm.spec()})\n"
             .encode())
    os.kill(os.getpid(), signal.SIGKILL)


CrashFn = Callable[[Arm, int], None]
_crash: CrashFn = _sigkill
"""What ``crash`` does; unit tests replace it to observe a hit without dying."""


class _Point:
    __slots__ = ("arm", "hits_count", "lock")

    def __init__(self, arm: Arm) -> None:
        self.arm = arm
        self.hits_count = 0
        self.lock = threading.Lock()

    def hit(self) -> None:
        with self.lock:
            self.hits_count += 1
            fire = self.hits_count == self.arm.at_hit
        if fire:
            _crash(self.arm, self.hits_count)


_points: Mapping[str, _Point] = MappingProxyType({})


def hit(name: str) -> None:
    """Pass failpoint ``name``: a no-op unless it is armed and this is the hit to act on."""
    point = _points.get(name)
    if point is not None:
        point.hit()


def armed(name: str) -> bool:
    """Whether ``name`` is armed in this process (for code that must change shape to place a
    failpoint, such as splitting a write from its fsync)."""
    return name in _points


def hits_count(name: str) -> int:
    """How often an armed failpoint was passed so far (0 when not armed)."""
    point = _points.get(name)
    return 0 if point is None else point.hits_count


def arm(spec: str) -> tuple[Arm, ...]:
    """Arm exactly the failpoints of ``spec`` (replacing any armed before), counts at zero."""
    global _points
    arms = parse(spec)
    _points = MappingProxyType({a.name: _Point(a) for a in arms})
    return arms


def disarm() -> None:
    global _points
    _points = MappingProxyType({})


def _arm_from_environment() -> None:
    spec = os.environ.get(ENV_VAR, "")
    if spec.strip():
        arms = arm(spec)
        os.write(2, f"failpoints armed: {','.join(a.spec() for a in arms)}\n".encode())


_arm_from_environment()

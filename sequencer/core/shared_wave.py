"""One first wave for the appenders of many logs (pure): the appends of different logs that
reach the sequencer in one event-loop iteration share one copyset, one store timeout and one
count of answers, instead of each appender picking, timing and counting its own (issue 15).

With 1,000 busy logs each appender carries about one record, so per record the sequencer
picked a copyset, pushed and popped a timer and took R answers into its log's core; with one
busy log a hundred records shared each of those. Here the logs' cores still give each append
its own LSNs and appender (``Sequencer.start_shared``: same window, same answers, same
release), but the driver (``sequencer.handlers.EffectDriver.append_groups``) sends their
first wave together: one copyset for all of them (logs with the same nodeset and
replication, each with no black- or graylisted node), their STOREs in the same STORE_BATCH
per node as before, one timer, and per answer only a count. When every STORE of the wave is
answered OK by every node of the copyset, each appender completes in its log's core
(``Sequencer.complete_shared``) exactly as if it had counted the answers itself.

Anything else hands the appenders back to their logs: an answer other than OK from any node
(an error, a preemption, a failed request) or the wave's timeout ends the sharing
(``dissolve``): each appender gets its own store timer with the wave's deadline
(``Sequencer.adopt_shared``), the OK answers it already got are replayed into its core, and
from then on the per-log rules (graylists, blacklists, new waves, amends, preemption) apply
unchanged. So the failure and retry semantics of every append are those of an appender that
sent its first wave to that copyset alone.
"""

from __future__ import annotations

from sequencer.core.appender import Appender
from sequencer.core.sequencer import Sequencer
from shared.types import NodeId

SHARED_WAVE_APPENDERS_MAX = 4096
"""Appenders one wave holds at most (more start another wave: a wave's STOREs to one node
fit in one STORE_BATCH)."""


class WaveEntry:
    """One appender of a shared wave: the owner its STOREs are staged with, so that an
    answer finds its wave without a lookup in its log's core."""

    __slots__ = ("appender", "ok_nodes", "sequencer", "wave")

    def __init__(self, wave: SharedWave, sequencer: Sequencer, appender: Appender) -> None:
        self.wave = wave
        self.sequencer = sequencer
        self.appender = appender
        self.ok_nodes: list[NodeId] = []
        """Nodes that answered this appender's STORE OK (replayed if the wave dissolves)."""


class SharedWave:
    """The shared first wave of some appenders of different logs."""

    __slots__ = ("copyset", "deadline_ms", "dissolved", "entries", "payload_bytes",
                 "remaining", "sampled", "sent_ms")

    def __init__(self, copyset: tuple[NodeId, ...], sent_ms: int, deadline_ms: int) -> None:
        self.copyset = copyset
        self.sent_ms = sent_ms
        self.deadline_ms = deadline_ms
        self.entries: list[WaveEntry] = []
        self.remaining = 0
        """STOREs times copyset nodes not answered OK yet: the wave is done at 0."""
        self.dissolved = False
        """Ended without completing: its appenders are their logs' own again."""
        self.payload_bytes = 0
        """The largest STORE's payload bytes (for the round-trip estimate)."""
        self.sampled: set[NodeId] = set()
        """Nodes whose round trip this wave has reported already (one sample per node)."""

    @property
    def done(self) -> bool:
        return not self.remaining and not self.dissolved

    def add(self, sequencer: Sequencer, appender: Appender) -> WaveEntry:
        entry = WaveEntry(self, sequencer, appender)
        self.entries.append(entry)
        self.remaining += len(self.copyset)
        if appender.payload_bytes > self.payload_bytes:
            self.payload_bytes = appender.payload_bytes
        return entry

    def on_ok(self, entry: WaveEntry, node: NodeId) -> bool:
        """``node`` answered ``entry``'s STORE OK; True when the wave is done by it."""
        entry.ok_nodes.append(node)
        self.remaining -= 1
        return not self.remaining

"""One append in flight: replicates its records to a copyset of R storage nodes, in waves.

Done when every recipient of the *current* wave answered STORED OK. A wave's store timeout
starts at the sequencer's estimate (``sequencer.core.store_timeout``: at least
``store_timeout_ms_min``) and doubles per wave up to ``store_timeout_ms_max``. On a
timeout the first outstanding recipient is graylisted (unless every recipient timed out, to
avoid a retry death spiral) and a new wave goes out. An error answer blacklists the node; the
first two waves are retried at once, later ones at the timeout. PREEMPTED ends the appender:
its outcome is unknown to the client.

Amends: a node that answered STORED OK in an earlier wave holds a durable copy of the same
payload at the same LSN. A new wave prefers such nodes and counts them as stored without
sending the payload again (LogDevice sends them a payload-less AMEND instead; the copy keeps
the copyset of the wave that wrote it). This keeps a spurious timeout from multiplying the
replication work.

Still working: a node that has not answered the previous wave's STORE yet (it is queued
behind other writes and fsyncs) is preferred too, and is not sent the payload again: the new
wave waits for that STORE's answer, which counts for it (OK like an amend, an error as this
wave's error). Only once per node and append: if the wave after it times out too, the node is
no longer preferred, and is sent the payload again if it is picked (the first STORE may have
been lost), and the storage node, should it still be writing
the first, answers both with the one write (``storage_node.core.inflight_stores``).
"""

from __future__ import annotations

from enum import Enum

from sequencer.core.nodeset_state import NodesetState
from sequencer.core.store_timeout import StoreLatency
from shared.config import SequencerConfig
from shared.effects import Send, send_of
from shared.ports import Rng
from shared.status import Status
from shared.types import Esn, LogId, Lsn, NodeId
from shared.wire.store import ProducerTag, Store, payloads_checksum, sequencer_store

_NONE: frozenset[NodeId] = frozenset()


class AppenderResult(Enum):
    PENDING = "pending"
    DONE = "done"
    PREEMPTED = "preempted"


class Appender:
    __slots__ = (
        "checksum", "compression", "deadline_ms", "deferred", "first_esn", "key",
        "log_id", "lsn", "missing", "payload_bytes", "payloads", "previous_sent_ms",
        "producers", "recipients", "records", "replication", "requests", "sent_ms", "stored_nodes",
        "timestamp_ms", "waited", "wave",
    )

    def __init__(
        self,
        *,
        log_id: LogId,
        lsn: Lsn,
        first_esn: Esn,
        payloads: tuple[bytes, ...],
        key: str | None,
        timestamp_ms: int,
        requests: tuple[tuple[int, int], ...],
        replication: int,
        producers: tuple[ProducerTag, ...] = (),
        compression: int = 0,
        records: int = 0,
    ) -> None:
        self.log_id = log_id
        self.lsn = lsn
        self.first_esn = first_esn
        self.payloads = payloads
        self.key = key
        self.timestamp_ms = timestamp_ms
        self.requests = requests
        """(request id, record count) of each client append sharing this appender, in LSN
        order."""
        self.compression = compression
        """A compressed batch (``shared.wire.store``): ``payloads`` is its one blob of
        ``records`` records, stored as is; it never shares an appender."""
        self.records = records if compression else len(payloads)
        assert (len(requests) == 1 and requests[0][1] == self.records) or sum(
            count for _, count in requests) == self.records
        assert not compression or (len(payloads) == 1 and len(requests) == 1)
        self.producers = producers
        """Producer tags of the idempotent appends among ``requests``: every copy carries
        them (``sequencer.core.producers``)."""
        self.replication = replication
        self.checksum = payloads_checksum(payloads)
        self.payload_bytes = sum(map(len, payloads))
        self.wave = 0
        self.deadline_ms = 0
        self.sent_ms = 0
        """When the current wave went out (its answers' round trips feed the estimate)."""
        self.previous_sent_ms = 0
        """When the previous wave went out."""
        self.deferred = _NONE
        """Current recipients not sent this wave: they answer the previous wave's STORE."""
        self.waited = _NONE
        """Nodes a wave has already waited for once: never preferred as still working again
        (a node that hangs would otherwise be picked again every other wave, for ever)."""
        self.recipients: dict[NodeId, Status | None] = {}
        """Current wave's recipients and their answers (None while outstanding)."""
        self.missing = 0
        """Current recipients whose answer is not OK (yet): the wave is done at 0."""
        self.stored_nodes: frozenset[NodeId] = frozenset()
        """Nodes that answered STORED OK in any wave."""

    @property
    def last_lsn(self) -> Lsn:
        return Lsn(self.lsn + self.records - 1)

    def store_timeout_ms(self, config: SequencerConfig, first_wave_ms: int | None = None) -> int:
        """This wave's timeout: ``first_wave_ms`` (default ``store_timeout_ms_min``) doubled
        per wave, at most ``store_timeout_ms_max``."""
        shift = min(self.wave - 1, 20)
        base_ms = config.store_timeout_ms_min if first_wave_ms is None else first_wave_ms
        return min(base_ms << shift, config.store_timeout_ms_max)

    def send_wave(
        self,
        *,
        nodeset: NodesetState,
        config: SequencerConfig,
        rng: Rng,
        sequencer_node: NodeId,
        last_known_good: Esn,
        release_lsn: Lsn,
        now_ms: int,
        latency: StoreLatency | None = None,
    ) -> list[Send]:
        self.wave += 1
        self.previous_sent_ms, self.sent_ms = self.sent_ms, now_ms
        stored = self.stored_nodes
        # Still working on the previous wave's STORE (sent in that wave, not answered yet):
        # preferred, and not sent it again (see the module). Only right after that wave: a
        # node that waited a wave without answering is no longer preferred over the others.
        previous, deferred = self.recipients, self.deferred
        waited = self.waited
        working = frozenset(n for n, answer in previous.items()
                            if answer is None and n not in deferred and n not in waited
                            ) if previous else _NONE
        copyset = nodeset.pick_copyset(self.replication, rng, now_ms,
                                       stored.union(working) if working else stored)
        self.deferred = _NONE
        if copyset is None:
            # Not enough available nodes: try again when this wave's timer fires.
            self.recipients = {}
            self.missing = 0
            self.deadline_ms = now_ms + self.store_timeout_ms(config)
            return []
        if working:
            self.deferred = frozenset(n for n in copyset if n in working and n not in stored)
            if self.deferred:
                self.waited = waited.union(self.deferred)
        skipped = stored.union(self.deferred) if self.deferred else stored
        first_wave_ms = None if latency is None else latency.timeout_ms(
            copyset, self.payload_bytes, config, stored)
        timeout_ms = self.store_timeout_ms(config, first_wave_ms)
        self.deadline_ms = now_ms + timeout_ms
        self.recipients = {n: (Status.OK if n in stored else None) for n in copyset}
        self.missing = sum(1 for n in copyset if n not in stored) if stored else len(copyset)
        sends = [n for n in copyset if n not in skipped]
        if not sends:
            return []
        store = sequencer_store(
            self.log_id, self.lsn, self.wave, sequencer_node, copyset, self.timestamp_ms,
            last_known_good, release_lsn, timeout_ms, self.key, self.payloads, self.checksum,
            self.producers, self.compression, self.records if self.compression else 0)
        return [send_of(node, store) for node in sends]

    def send_shared_wave(
        self, *, copyset: tuple[NodeId, ...], timeout_ms: int, sequencer_node: NodeId,
        last_known_good: Esn, release_lsn: Lsn, now_ms: int,
    ) -> Store:
        """The first wave, to ``copyset`` picked for many appenders at once
        (``sequencer.core.shared_wave``): the state ``send_wave`` leaves, and the STORE."""
        assert self.wave == 0 and not self.stored_nodes
        self.wave = 1
        self.sent_ms = now_ms
        self.deadline_ms = now_ms + timeout_ms
        self.recipients = dict.fromkeys(copyset)
        self.missing = len(copyset)
        return sequencer_store(
            self.log_id, self.lsn, 1, sequencer_node, copyset, self.timestamp_ms,
            last_known_good, release_lsn, timeout_ms, self.key, self.payloads, self.checksum,
            self.producers, self.compression, self.records if self.compression else 0)

    def awaited_sent_ms(self, node: NodeId) -> int:
        """When the STORE whose answer ``node`` owes the current wave went out."""
        return self.previous_sent_ms if node in self.deferred else self.sent_ms

    def on_reply(
        self, node: NodeId, wave: int, status: Status, nodeset: NodesetState, now_ms: int
    ) -> tuple[AppenderResult, bool]:
        """Account for one STORED (or a transport failure reported as a status).

        Returns the result and whether a new wave should go out now."""
        if status is Status.PREEMPTED:
            return AppenderResult.PREEMPTED, False
        if status is Status.OK and wave <= self.wave:
            return (AppenderResult.DONE if self.on_stored_ok(node) else AppenderResult.PENDING,
                    False)
        owed_wave = self.wave - 1 if node in self.deferred else self.wave
        if wave != owed_wave or node not in self.recipients or self.recipients[node] is not None:
            return AppenderResult.PENDING, False
        self.recipients[node] = status
        nodeset.blacklist(node, status, now_ms)
        return AppenderResult.PENDING, self.wave <= 2

    def on_stored_ok(self, node: NodeId) -> bool:
        """``node`` answered STORED OK to this wave or an earlier one (a copy from any wave is
        as good as one from this wave: see Amends above). True when the wave is done: every
        current recipient holds a copy."""
        stored = self.stored_nodes
        if node not in stored:
            self.stored_nodes = stored | {node}
        recipients = self.recipients
        if recipients.get(node, Status.OK) is None:
            recipients[node] = Status.OK
            self.missing -= 1
            return not self.missing
        return False

    def on_timeout(self, nodeset: NodesetState, now_ms: int) -> None:
        """Graylist the first outstanding recipient unless nobody answered at all."""
        outstanding = [n for n, s in self.recipients.items() if s is None]
        if outstanding and len(outstanding) < len(self.recipients):
            nodeset.graylist(outstanding[0], now_ms)

"""Epoch (log) recovery, pure: the sequencer of epoch ``seal_epoch + 1`` makes every epoch in
``(last clean epoch, seal_epoch]`` immutable before it releases anything of its own
(LogDevice's LogRecoveryRequest + EpochRecovery; ``logdevice-digest.md`` §5).

Phases, each driven by replies and ``now_ms`` (the driver sends the ``Send`` effects and hands
every reply back to ``on_reply``, and a failed request as its ``Status``):

1. SEALING: SEAL every nodeset member. Once an f-majority that can also take R copies
   (``max(|nodeset| - R + 1, R)`` nodes) has sealed durably, wait ``recovery_grace_ms`` for the
   rest, then go on with whoever sealed: the *recovery set*.
2. DIGESTING: per epoch, the highest last-known-good ESN any sealed node saw (``lng``) and the
   highest ESN held. An epoch with copies above ``lng`` is digested: every copy from ``lng + 1``
   on, from every node of the recovery set; per ESN the copy with the highest precedence wins.
3. MUTATING: per epoch, for every ESN in ``[lng + 1, max(bridge, last digested ESN)]``: the
   winning record is re-replicated, written by recovery (with our seal epoch as its "wave"), to
   every recovery-set node that holds any copy of it and to more until R have it; an ESN nobody
   in the recovery set holds (so never acknowledged) becomes a hole plug; the ESN after the last
   record becomes the bridge. An epoch nobody holds copies above ``lng`` of only gets its bridge.
4. CLEANING: CLEAN with the epoch's outcome (bridge, holes, and the attempt that decided) to
   every nodeset member; every recovery-set node must confirm. The others are settled by the
   purge that runs once recovery is done (``sequencer.core.purge``), durably: a node that
   missed its CLEAN reports the epoch as unsettled to any later sequencer.
5. ADVANCING: ``WriteLastCleanEpoch(seal_epoch, tail)`` in the epoch store. Then DONE.

Authoritative status (``shared.authority``): a node that may have lost copies of the
recovered epochs says so in SEALED (and DIGEST). Its copies still count, but its silence does
not: the recovery set must hold an f-majority (``|nodeset| - R + 1``) of nodes that vouch for
those epochs, or an acknowledged record only the silent node forgot would be plugged. Without
one, recovery waits for more nodes (and starts over after ``recovery_timeout_ms``).

A newer seal anywhere (SEALED/STORED/CLEANED PREEMPTED, or a digest refused as PREEMPTED) ends
recovery as PREEMPTED. A node that stops answering is dropped from the recovery set while an
f-majority that can take R copies remains; otherwise recovery retries, and after
``recovery_timeout_ms`` starts over with a new SEAL round. Everything it writes is idempotent,
so a crash of the recovering sequencer at any step leaves work that the next one redoes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from sequencer.core.effects import RecoveryProgress, WriteLastCleanEpoch
from shared.config import SequencerConfig
from shared.effects import Send
from shared.epoch_metadata import LastCleanEpoch
from shared.limits import BATCH_RECORDS_MAX
from shared.status import Status
from shared.types import (
    ESN_MAX,
    Epoch,
    Esn,
    LogId,
    Lsn,
    NodeId,
    compose_lsn,
)
from shared.wire.recovery import Clean, Cleaned, Digest, GetDigest, Seal, Sealed
from shared.wire.store import (
    RECOVERY_BRIDGE,
    RECOVERY_HOLE,
    ProducerTag,
    RecordFlags,
    Store,
    Stored,
    copy_precedence,
    payloads_checksum,
    recovery_wave,
)

DIGEST_RECORDS_MAX = 1000
"""Copies per DIGEST answer (one page)."""
DIGEST_BYTES_MAX = 4 * 1024 * 1024
"""Payload bytes per DIGEST answer."""
RUN_BYTES_MAX = 1024 * 1024
"""Payload bytes of one mutation STORE carrying a run of records."""
MUTATIONS_INFLIGHT_MAX = 512
"""Mutation STOREs (one per node and ESN or hole run) outstanding at once per log."""
_UNUSABLE = frozenset({Status.CONNFAILED, Status.PEER_CLOSED, Status.TIMEDOUT, Status.SHUTDOWN,
                       Status.NOTREADY, Status.DISABLED, Status.NOSPC, Status.CHECKSUM_MISMATCH,
                       Status.INTERNAL})
"""Failures that say the node cannot serve recovery now (unreachable, not taking writes, or a
corrupt copy in the digest range): it is dropped from the recovery set if enough remain, as
LogDevice leaves non-writable nodes out of the mutation set."""


class Phase(Enum):
    SEALING = "SEALING"
    DIGESTING = "DIGESTING"
    MUTATING = "MUTATING"
    CLEANING = "CLEANING"
    ADVANCING = "ADVANCING"
    DONE = "DONE"
    PREEMPTED = "PREEMPTED"


@dataclass(slots=True)
class _Copy:
    """The winning copy of one ESN in the digest, and which recovery-set nodes hold any copy."""

    precedence: tuple[int, int]
    flags: int
    timestamp_ms: int
    key: str | None
    payload: bytes
    producer: ProducerTag | None = None
    """The tag of the append the record came from; an LSN names one record, so any copy's
    tag is the record's."""
    holders: set[NodeId] = field(default_factory=set)


@dataclass(slots=True)
class EpochOutcome:
    """What recovery decided for one epoch (the CLEAN message carries it)."""

    epoch: Epoch
    lng: int
    bridge_esn: int
    """0 when the epoch's last record sits at ESN_MAX (no bridge)."""
    holes: list[tuple[int, int]]
    last_record_esn: int
    """The highest ESN holding a record after recovery (``lng`` if none above it)."""


@dataclass(slots=True)
class _Mutation:
    store: Store
    pending: set[NodeId]
    done: set[NodeId] = field(default_factory=set)


class LogRecovery:
    def __init__(
        self, *, log_id: LogId, node_id: NodeId, seal_epoch: Epoch, lce: LastCleanEpoch,
        nodeset: tuple[NodeId, ...], replication: int, config: SequencerConfig,
        attempts_before: int = 0,
    ) -> None:
        assert lce.epoch < seal_epoch, (lce.epoch, seal_epoch)
        self.log_id = log_id
        self.node_id = node_id
        self.seal_epoch = seal_epoch
        self.lce = lce
        self.nodeset = nodeset
        self.replication = replication
        self.config = config
        self.needed = max(len(nodeset) - replication + 1, replication)
        """Nodes the recovery set must keep: an f-majority that can also hold R copies."""
        self.vouching_needed = max(len(nodeset) - replication + 1, 1)
        """Members that vouch for the recovered epochs the recovery set must keep."""
        self._unsure: set[NodeId] = set()
        """Nodes that said they may have lost copies of the recovered epochs."""
        self.phase = Phase.SEALING
        self.attempt = attempts_before
        """Attempts of this recovery so far, counted on from an earlier instance with the same
        seal epoch so that every attempt writes copies of a distinct precedence."""
        self.preempted_by: tuple[Epoch, NodeId | None] = (Epoch(0), None)
        self.tail_lsn = lce.tail_lsn
        self.outcomes: dict[Epoch, EpochOutcome] = {}
        self.cleans: dict[Epoch, Clean] = {}
        """The CLEAN of each epoch, once decided. Members outside the recovery set (down, or
        too slow to seal) are sent it once, not waited for; the sequencer's purge
        (``sequencer.core.purge``) settles any of them that missed it."""
        self._outstanding: dict[tuple[NodeId, Any], Any] = {}
        """(node, key) -> the request in flight; a reply to anything else is stale."""
        self._keys: dict[tuple[NodeId, int], Any] = {}
        """(node, id(request)) -> key, for requests in ``_outstanding`` (which keeps them
        alive, so their ids are unique)."""
        self._retry: list[tuple[int, NodeId, Any]] = []
        self._sealed: dict[NodeId, tuple[tuple[int, int, int], ...]] = {}
        self._members: set[NodeId] = set()
        self._grace_until_ms: int | None = None
        self._deadline_ms = 0
        self._lngs: dict[Epoch, int] = {}
        self._digests: dict[Epoch, dict[int, _Copy]] = {}
        self._mutations: dict[int, _Mutation] = {}
        self._mutation_queue: list[_Mutation] = []
        self._mutations_inflight = 0
        self._mutation_ids = 0
        self._lce_due_ms: int | None = None

    # ---- driving -------------------------------------------------------------------------

    def start(self, now_ms: int) -> list[Any]:
        """(Re)start from SEAL with a fresh recovery set."""
        self.attempt += 1
        self.phase = Phase.SEALING
        self._outstanding.clear()
        self._keys.clear()
        self._retry.clear()
        self._sealed.clear()
        self._unsure.clear()
        self._members.clear()
        self._grace_until_ms = None
        self._deadline_ms = now_ms + self.config.recovery_timeout_ms
        self._lngs.clear()
        self._digests.clear()
        self._mutations.clear()
        self._mutation_queue.clear()
        self._mutations_inflight = 0
        self._lce_due_ms = None
        self.outcomes.clear()
        self.cleans.clear()
        self.tail_lsn = self.lce.tail_lsn
        seal = Seal(log_id=self.log_id, seal_epoch=self.seal_epoch, sealed_by=self.node_id,
                    from_epoch=Epoch(self.lce.epoch + 1))
        effects: list[Any] = [RecoveryProgress(self.log_id, self.phase.value, self.attempt)]
        for node in self.nodeset:
            effects.append(self._request(node, "seal", seal))
        return effects

    @property
    def finished(self) -> bool:
        return self.phase in (Phase.DONE, Phase.PREEMPTED)

    def deadline_ms(self) -> int | None:
        if self.finished:
            return None
        due = [self._deadline_ms]
        if self._retry:
            due.append(min(at for at, _, _ in self._retry))
        if self._grace_until_ms is not None and self.phase is Phase.SEALING:
            due.append(self._grace_until_ms)
        if self._lce_due_ms is not None:
            due.append(self._lce_due_ms)
        return min(due)

    def on_timer(self, now_ms: int) -> list[Any]:
        if self.finished:
            return []
        if now_ms >= self._deadline_ms:
            return self.start(now_ms)
        effects: list[Any] = []
        due = [item for item in self._retry if item[0] <= now_ms]
        self._retry = [item for item in self._retry if item[0] > now_ms]
        for _, node, (key, message) in due:
            if self._still_wanted(node, key):
                effects.append(self._request(node, key, message))
        if self._lce_due_ms is not None and self._lce_due_ms <= now_ms:
            self._lce_due_ms = None
            effects.append(self._write_lce())
        if (self.phase is Phase.SEALING and self._grace_until_ms is not None
                and now_ms >= self._grace_until_ms):
            effects.extend(self._start_digest(now_ms))
        return effects

    def on_reply(self, node: NodeId, request: Any, reply: Any, now_ms: int) -> list[Any]:
        """The answer (a message, or a ``Status`` when the request failed) to ``request``."""
        key = self._keys.pop((node, id(request)), None)
        if self.finished or key is None or self._outstanding.get((node, key)) is not request:
            return []  # stale: from an earlier attempt or phase, or not awaited
        del self._outstanding[(node, key)]
        status = reply if isinstance(reply, Status) else getattr(reply, "status", Status.BADMSG)
        if status is Status.PREEMPTED:
            return self._preempted(reply)
        if type(reply) is Sealed and status is Status.OK:
            return self._on_sealed(node, reply, now_ms)
        if type(reply) is Digest and status is Status.OK:
            return self._on_digest(node, key, reply, now_ms)
        if type(reply) is Stored and status is Status.OK:
            return self._on_mutated(node, key, now_ms)
        if type(reply) is Cleaned and status is Status.OK:
            return self._after_reply(now_ms)
        return self._on_failure(node, key, request, status, now_ms)

    def on_lce_written(self, status: Status, stored_epoch: Epoch, now_ms: int) -> list[Any]:
        """The epoch store's answer to ``WriteLastCleanEpoch``; ``stored_epoch`` is the last
        clean epoch it holds now when known (STALE means someone already advanced it)."""
        if self.phase is not Phase.ADVANCING:
            return []
        if status is Status.OK or stored_epoch >= self.seal_epoch:
            self.phase = Phase.DONE
            return [RecoveryProgress(self.log_id, self.phase.value, self.attempt)]
        self._lce_due_ms = now_ms + self.config.recovery_retry_ms
        return []

    # ---- requests and failures -----------------------------------------------------------

    def _request(self, node: NodeId, key: Any, message: Any) -> Send:
        previous = self._outstanding.get((node, key))
        if previous is not None:
            self._keys.pop((node, id(previous)), None)
        self._outstanding[(node, key)] = message
        self._keys[(node, id(message))] = key
        return Send(node, message)

    def _forget(self, keep: Any) -> None:
        """Keep only the outstanding requests for which ``keep(node, key)`` holds."""
        self._outstanding = {k: v for k, v in self._outstanding.items() if keep(*k)}
        self._keys = {(node, id(v)): key for (node, key), v in self._outstanding.items()}

    def _still_wanted(self, node: NodeId, key: Any) -> bool:
        if self.phase is Phase.SEALING:
            return key == "seal" and node not in self._sealed
        return node in self._members

    def _on_failure(self, node: NodeId, key: Any, request: Any, status: Status,
                    now_ms: int) -> list[Any]:
        if self.phase is not Phase.SEALING and status in _UNUSABLE and (
                len(self._members) > self.needed and node in self._members
                and self._vouching(self._members - {node}) >= self.vouching_needed):
            return self._drop_member(node, now_ms)
        self._retry.append((now_ms + self.config.recovery_retry_ms, node, (key, request)))
        return []

    def _drop_member(self, node: NodeId, now_ms: int) -> list[Any]:
        """``node`` is gone: go on without it, moving its share of the work elsewhere."""
        self._members.discard(node)
        self._forget(lambda n, _: n != node)
        self._retry = [item for item in self._retry if item[1] != node]
        effects: list[Any] = []
        if self.phase is Phase.DIGESTING:
            # Its copies are not needed: the remaining members are still an f-majority.
            for copies in self._digests.values():
                for copy in copies.values():
                    copy.holders.discard(node)
            effects.extend(self._after_reply(now_ms))
        elif self.phase is Phase.MUTATING:
            for mutation in self._mutation_queue:
                self._retarget(mutation, node)
            for mutation_id, mutation in list(self._mutations.items()):
                added = self._retarget(mutation, node)
                if added is not None:
                    effects.append(self._request(added, mutation_id, mutation.store))
                elif not mutation.pending:
                    del self._mutations[mutation_id]
                    self._mutations_inflight -= 1
            effects.extend(self._pump_mutations())
            effects.extend(self._after_reply(now_ms))
        elif self.phase is Phase.CLEANING:
            effects.extend(self._after_reply(now_ms))
        return effects

    def _retarget(self, mutation: _Mutation, gone: NodeId) -> NodeId | None:
        """Replace ``gone`` among the mutation's targets with a member that has no copy of it
        yet, if R copies are not assured without one; returns the member added."""
        if gone not in mutation.pending:
            return None
        mutation.pending.discard(gone)
        if len(mutation.done) + len(mutation.pending) >= self.replication:
            return None
        spare = [n for n in sorted(self._members)
                 if n not in mutation.done and n not in mutation.pending]
        assert spare, "a recovery set of at least R members always has a spare"
        mutation.pending.add(spare[0])
        return spare[0]

    def _preempted(self, reply: Any) -> list[Any]:
        epoch = getattr(reply, "sealed_epoch", Epoch(0))
        self.preempted_by = (epoch, getattr(reply, "sealed_by", None))
        self.phase = Phase.PREEMPTED
        self._forget(lambda _n, _k: False)
        self._retry.clear()
        return [RecoveryProgress(self.log_id, self.phase.value, self.attempt)]

    # ---- SEALING -------------------------------------------------------------------------

    def _on_sealed(self, node: NodeId, reply: Sealed, now_ms: int) -> list[Any]:
        if self.phase is not Phase.SEALING:
            return []
        self._sealed[node] = tuple(t for t in reply.tails if _valid_tail(t))
        self._note_unsure(node, reply.non_authoritative)
        if (len(self._sealed) < self.needed
                or self._vouching(self._sealed) < self.vouching_needed):
            return []
        if len(self._sealed) == len(self.nodeset):
            return self._start_digest(now_ms)
        if self._grace_until_ms is None:
            self._grace_until_ms = now_ms + self.config.recovery_grace_ms
        return []

    def _note_unsure(self, node: NodeId, non_authoritative: object) -> None:
        # Any ranges at all, even malformed ones, make the node unsure: that only makes
        # recovery wait for more nodes.
        if non_authoritative:
            self._unsure.add(node)

    def _vouching(self, nodes: set[NodeId] | dict[NodeId, Any]) -> int:
        """How many of ``nodes`` vouch for the recovered epochs."""
        return sum(1 for node in nodes if node not in self._unsure)

    # ---- DIGESTING -----------------------------------------------------------------------

    def _start_digest(self, now_ms: int) -> list[Any]:
        self.phase = Phase.DIGESTING
        self._members = set(self._sealed)
        self._retry = [item for item in self._retry if item[1] in self._members]
        # SEALs still in flight are of no use any more.
        self._forget(lambda _n, key: key != "seal")
        effects: list[Any] = [RecoveryProgress(self.log_id, self.phase.value, self.attempt)]
        lasts: dict[Epoch, int] = {}
        for tails in self._sealed.values():
            for epoch, lng, last in tails:
                self._lngs[Epoch(epoch)] = max(self._lngs.get(Epoch(epoch), 0), lng)
                lasts[Epoch(epoch)] = max(lasts.get(Epoch(epoch), 0), last)
        for epoch in self._epochs():
            lng = self._lngs.setdefault(epoch, 0)
            if lasts.get(epoch, 0) > lng:
                self._digests[epoch] = {}
                for node in sorted(self._members):
                    effects.append(self._request(node, ("digest", epoch), self._digest_request(
                        epoch, lng + 1)))
        effects.extend(self._after_reply(now_ms))
        return effects

    def _epochs(self) -> list[Epoch]:
        return [Epoch(e) for e in range(self.lce.epoch + 1, self.seal_epoch + 1)]

    def _digest_request(self, epoch: Epoch, from_esn: int) -> GetDigest:
        return GetDigest(log_id=self.log_id, epoch=epoch, from_esn=Esn(from_esn),
                         seal_epoch=self.seal_epoch, records_max=DIGEST_RECORDS_MAX,
                         bytes_max=DIGEST_BYTES_MAX)

    def _on_digest(self, node: NodeId, key: Any, reply: Digest, now_ms: int) -> list[Any]:
        epoch = Epoch(key[1])
        copies = self._digests.get(epoch)
        if self.phase is not Phase.DIGESTING or copies is None or node not in self._members:
            return []
        lng = self._lngs[epoch]
        self._note_unsure(node, reply.non_authoritative)
        for esn, flags, wave, timestamp_ms, entry_key, payload, producer in reply.entries:
            if not lng < esn <= ESN_MAX:
                continue
            precedence = copy_precedence(flags, wave)
            copy = copies.get(esn)
            if copy is None:
                copy = copies[esn] = _Copy(precedence, flags, timestamp_ms, entry_key, payload,
                                           producer)
            elif precedence > copy.precedence:
                copy.precedence, copy.flags = precedence, flags
                copy.timestamp_ms, copy.key, copy.payload = timestamp_ms, entry_key, payload
            if copy.producer is None and producer is not None:
                copy.producer = producer
            copy.holders.add(node)
        if reply.next_esn <= ESN_MAX and reply.entries:
            return [self._request(node, key, self._digest_request(epoch, reply.next_esn))]
        return self._after_reply(now_ms)

    # ---- MUTATING ------------------------------------------------------------------------

    def _start_mutations(self, now_ms: int) -> list[Any]:
        self.phase = Phase.MUTATING
        effects: list[Any] = [RecoveryProgress(self.log_id, self.phase.value, self.attempt)]
        members = sorted(self._members)
        for epoch in self._epochs():
            outcome, plan = plan_epoch(epoch, self._lngs.get(epoch, 0),
                                       self._digests.get(epoch, {}))
            self.outcomes[epoch] = outcome
            if outcome.last_record_esn:
                self.tail_lsn = max(self.tail_lsn,
                                    compose_lsn(epoch, Esn(outcome.last_record_esn)))
            for esn, flags, run in plan:
                copy = run[0]
                holders = copy.holders & self._members if copy is not None else set()
                targets = set(holders)
                for offset in range(len(members)):
                    if len(targets) >= self.replication:
                        break
                    targets.add(members[(esn + offset) % len(members)])
                self._mutation_queue.append(_Mutation(
                    self._mutation_store(epoch, esn, flags, run, outcome.lng), targets))
        effects.extend(self._pump_mutations())
        effects.extend(self._after_reply(now_ms))
        return effects

    def _mutation_store(self, epoch: Epoch, esn: int, flags: int, run: list[_Copy | None],
                        lng: int) -> Store:
        first = run[0]
        producers: tuple[ProducerTag, ...] = ()
        if flags & RecordFlags.HOLE or first is None:
            payloads: tuple[bytes, ...] = (b"",) * len(run)
            timestamp_ms, key = 0, None
        else:
            payloads = tuple(copy.payload for copy in run if copy is not None)
            assert len(payloads) == len(run)
            timestamp_ms, key = first.timestamp_ms, first.key
            # Re-replicated copies keep their producer tags: a later sequencer finds the
            # append on any f-majority of the nodeset (see sequencer.core.producers).
            producers = tuple(dict.fromkeys(
                copy.producer for copy in run if copy is not None and copy.producer))
        return Store(log_id=self.log_id, lsn=compose_lsn(epoch, Esn(esn)),
                     wave=recovery_wave(self.seal_epoch, self.attempt),
                     sequencer_node=self.node_id, copyset=(), timestamp_ms=timestamp_ms,
                     last_known_good=Esn(lng), release_lsn=Lsn(0),
                     timeout_ms=self.config.recovery_retry_ms, key=key, payloads=payloads,
                     checksum=payloads_checksum(payloads), flags=flags, producers=producers)

    def _pump_mutations(self) -> list[Any]:
        effects: list[Any] = []
        while self._mutation_queue and self._mutations_inflight < MUTATIONS_INFLIGHT_MAX:
            mutation = self._mutation_queue.pop(0)
            self._mutation_ids += 1
            self._mutations[self._mutation_ids] = mutation
            self._mutations_inflight += 1
            for node in sorted(mutation.pending):
                effects.append(self._request(node, self._mutation_ids, mutation.store))
        return effects

    def _on_mutated(self, node: NodeId, key: Any, now_ms: int) -> list[Any]:
        mutation = self._mutations.get(key)
        if self.phase is not Phase.MUTATING or mutation is None:
            return []
        mutation.pending.discard(node)
        mutation.done.add(node)
        if not mutation.pending:
            del self._mutations[key]
            self._mutations_inflight -= 1
        effects = self._pump_mutations()
        effects.extend(self._after_reply(now_ms))
        return effects

    # ---- CLEANING and ADVANCING ----------------------------------------------------------

    def _start_clean(self) -> list[Any]:
        self.phase = Phase.CLEANING
        effects: list[Any] = [RecoveryProgress(self.log_id, self.phase.value, self.attempt)]
        for epoch, outcome in sorted(self.outcomes.items()):
            clean = Clean(log_id=self.log_id, epoch=epoch, seal_epoch=self.seal_epoch,
                          sealed_by=self.node_id, bridge_esn=Esn(outcome.bridge_esn),
                          holes=tuple(outcome.holes), attempt=self.attempt)
            self.cleans[epoch] = clean
            for node in self.nodeset:
                if node in self._members:
                    effects.append(self._request(node, ("clean", epoch), clean))
                else:
                    # Not waited for: lets a node that missed recovery purge stray copies now
                    # (the purge that follows recovery makes sure of it).
                    effects.append(Send(node, clean))
        return effects

    def _write_lce(self) -> WriteLastCleanEpoch:
        return WriteLastCleanEpoch(self.log_id, self.seal_epoch, self.tail_lsn)

    def _after_reply(self, now_ms: int) -> list[Any]:
        """Move to the next phase once nothing of the current one is outstanding."""
        if self._outstanding or any(item[1] in self._members for item in self._retry):
            return []
        if self.phase is Phase.DIGESTING:
            if self._vouching(self._members) < self.vouching_needed:
                return []  # a member found damage mid-digest: start over at the deadline
            return self._start_mutations(now_ms)
        if self.phase is Phase.MUTATING and not self._mutation_queue and not self._mutations:
            return self._start_clean() + self._after_reply(now_ms)
        if self.phase is Phase.CLEANING:
            self.phase = Phase.ADVANCING
            return [RecoveryProgress(self.log_id, self.phase.value, self.attempt),
                    self._write_lce()]
        return []


PlanStep = tuple[int, int, list["_Copy | None"]]
"""(first_esn, flags, the winning copy of each ESN of the run): one mutation STORE."""


def plan_epoch(
    epoch: Epoch, lng: int, copies: dict[int, _Copy],
) -> tuple[EpochOutcome, list[PlanStep]]:
    """Recovery's decision for one epoch from its digest (copies above ``lng``): the outcome,
    and the mutations in runs that one STORE can carry (consecutive ESNs with the same
    holders; records also with the same timestamp and key, as one append batch has).

    LogDevice's rules: after the first winning bridge everything is a hole; the bridge goes
    right after the last record; every other ESN up to the last digested one without a winning
    record is a hole."""
    esns = sorted(copies)
    first_bridge = next((esn for esn in esns if copies[esn].flags & RecordFlags.BRIDGE), None)
    records = [esn for esn in esns if not copies[esn].flags & RecordFlags.HOLE
               and (first_bridge is None or esn < first_bridge)]
    last_record = records[-1] if records else lng
    bridge_esn = last_record + 1 if last_record < ESN_MAX else 0
    end = max(bridge_esn, esns[-1] if esns else 0)
    plan: list[PlanStep] = []
    holes: list[tuple[int, int]] = []
    record_set = set(records)
    run_bytes = 0
    for esn in range(lng + 1, end + 1):
        copy = copies.get(esn)
        if esn == bridge_esn:
            plan.append((esn, int(RECOVERY_BRIDGE), [copy]))
            continue
        flags = int(RecordFlags.WRITTEN_BY_RECOVERY) if esn in record_set else int(
            RECOVERY_HOLE)
        size = len(copy.payload) if copy is not None and esn in record_set else 0
        last = plan[-1] if plan else None
        if (last is not None and last[1] == flags and last[0] + len(last[2]) == esn
                and len(last[2]) < BATCH_RECORDS_MAX and run_bytes + size <= RUN_BYTES_MAX
                and _same_run(last[2][0], copy, data=esn in record_set)):
            last[2].append(copy)
            run_bytes += size
        else:
            plan.append((esn, flags, [copy]))
            run_bytes = size
        if esn not in record_set:
            if holes and holes[-1][1] == esn - 1:
                holes[-1] = (holes[-1][0], esn)
            else:
                holes.append((esn, esn))
    return EpochOutcome(epoch, lng, bridge_esn, holes, last_record), plan


def _same_run(first: _Copy | None, copy: _Copy | None, *, data: bool) -> bool:
    if _holders(first) != _holders(copy):
        return False
    if not data:
        return True
    return (first is not None and copy is not None and first.timestamp_ms == copy.timestamp_ms
            and first.key == copy.key)


def _holders(copy: _Copy | None) -> frozenset[NodeId]:
    return frozenset(copy.holders) if copy is not None else frozenset()


def _valid_tail(tail: Any) -> bool:
    return (type(tail) is tuple and len(tail) == 3 and all(type(x) is int for x in tail)
            and 0 <= tail[1] <= ESN_MAX and 0 <= tail[2] <= ESN_MAX)


"""Purging, pure: nodes that missed a recovery's CLEAN settle the stray copies they hold
(issue 16 item 6; LogDevice purges such epochs when a RELEASE reaches a node that is behind,
``PurgeUncleanEpochs``).

The state is durable on the storage nodes, not in the sequencer: a node reports, in its
GET_LOG_STATE answer (``LogState.unclean``), every epoch in which it holds copies above its
last-known-good ESN and has applied no CLEAN (applying one raises that ESN durably,
``StoreMachine.clean_mark``). So a sequencer that dies before every CLEAN landed loses
nothing: whichever sequencer of the log is next releasable asks again.

A sequencer whose earlier epochs are all clean (activated over a clean epoch, or its recovery
is done) runs one ``PurgeCoordinator``: it asks every nodeset node for its unsettled epochs,
and for each epoch below its own sends that node the epoch's CLEAN. It knows the outcome of
the epochs its own recovery decided; any other it derives from the nodes that hold the
decision: a digest of the node's unsettled range (``lng + 1 .. last``) from an f-majority of
the *other* nodeset members that vouch for it (authoritative, ``shared.authority``). That
works because the epoch is clean: recovery wrote each of
its decisions (records, holes, the bridge) to R nodes, which every f-majority meets, with a
precedence above any stray; an ESN of the range whose best copy there is a record is one
(acknowledged, or re-replicated by recovery), one whose best copy is a hole or that nobody
there holds is not, and everything from the first winning bridge on is not either (the
bridge is past every node's last-known-good ESN, so it lies in the range if the node holds
anything at or after it). With no bridge in the range and no copy past it on those nodes,
the epoch ends inside the range, right after its last record (where a reader of those nodes
sees it end): the CLEAN puts the bridge there. An epoch drained cleanly has every record on R
nodes and no strays: the derived CLEAN then plugs nothing and only settles the node.

Nodes that do not answer are asked again after a doubling delay (from ``recovery_retry_ms``
to ``PURGE_RETRY_MS_MAX``) for as long as this sequencer lives; nothing here is capped or
lost when it dies. Every request goes through the driver like recovery's (with
``recovery_request_timeout_ms``). A digest refused as PREEMPTED (a newer sequencer sealed the
node) stops the coordinator: the newer sequencer purges instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.config import SequencerConfig
from shared.effects import Send
from shared.status import Status
from shared.types import ESN_MAX, Epoch, Esn, LogId, NodeId, epoch_valid
from shared.wire.read import GetLogState, LogState
from shared.wire.recovery import Clean, Cleaned, Digest, GetDigest
from shared.wire.store import (
    RECOVERY_ATTEMPT_MAX,
    RecordFlags,
    copy_precedence,
    recovery_wave,
    seal_epoch_of_wave,
)

PURGE_RETRY_MS_MAX = 30_000
"""Longest wait before a node that did not answer is asked again."""
PURGE_DIGEST_RECORDS_MAX = 1000
"""Copies per digest page of an unsettled range."""
PURGE_DIGEST_BYTES_MAX = 4 * 1024 * 1024
PURGE_EPOCHS_PER_ANSWER_MAX = 64
"""Unsettled epochs taken from one node's answer (a node lists at most as many, lowest
first; the rest come with the next answer): bounds the derivations in flight per node."""


@dataclass(slots=True)
class _Derivation:
    """The outcome of ``epoch`` over ``target``'s unsettled range, being read from the
    others: per ESN the best copy's (precedence, flags)."""

    target: NodeId
    epoch: Epoch
    lng: int
    last: int
    best: dict[int, tuple[tuple[int, int], int]] = field(default_factory=dict)
    complete: set[NodeId] = field(default_factory=set)
    """The nodes that sent the whole range and vouch for it (authoritative)."""
    more_after: bool = False
    """Some node holds a copy past ``last``: the epoch does not end inside the range."""


class PurgeCoordinator:
    def __init__(self, *, log_id: LogId, node_id: NodeId, epoch: Epoch,
                 nodeset: tuple[NodeId, ...], replication: int, config: SequencerConfig,
                 known: dict[Epoch, Clean] | None = None) -> None:
        self.log_id = log_id
        self.node_id = node_id
        self.epoch = epoch
        """This sequencer's epoch: every epoch below it is clean."""
        self.nodeset = nodeset
        self.config = config
        self.f_majority = max(len(nodeset) - replication + 1, 1)
        self.known: dict[Epoch, Clean] = dict(known or {})
        """Outcomes this sequencer's own recovery decided."""
        self.stopped = False
        self.cleans_sent = 0
        """CLEANs sent to nodes that reported unsettled epochs (for tests and logs)."""
        self._left: set[NodeId] = set(nodeset)
        """Nodes not yet known to hold nothing unsettled below ``epoch``."""
        self._cleaned: dict[NodeId, set[Epoch]] = {}
        self._open: dict[NodeId, set[Epoch]] = {}
        """Per node, the epochs whose CLEAN is being derived or is in flight."""
        self._derivations: dict[tuple[NodeId, Epoch], _Derivation] = {}
        self._pending: dict[tuple[NodeId, int], tuple[Any, Any]] = {}
        """(node, id(request)) -> (key, request) of every request in flight (kept alive here,
        so ids are unique; one CLEAN object may go to several nodes)."""
        self._retry: list[tuple[int, NodeId, Any, Any]] = []
        self._backoff_ms: dict[NodeId, int] = {}

    @property
    def finished(self) -> bool:
        return self.stopped or not self._left

    def start(self) -> list[Any]:
        return [self._request(node, ("state", node), GetLogState(log_id=self.log_id))
                for node in self.nodeset]

    def owns(self, node: NodeId, request: Any) -> bool:
        entry = self._pending.get((node, id(request)))
        return entry is not None and entry[1] is request

    def deadline_ms(self) -> int | None:
        if self.finished or not self._retry:
            return None
        return min(at for at, _, _, _ in self._retry)

    def on_timer(self, now_ms: int) -> list[Any]:
        if self.finished:
            return []
        due = [item for item in self._retry if item[0] <= now_ms]
        self._retry = [item for item in self._retry if item[0] > now_ms]
        return [self._request(node, key, message) for _, node, key, message in due
                if self._wanted(key)]

    def on_reply(self, node: NodeId, request: Any, reply: Any, now_ms: int) -> list[Any]:
        """The answer (or failure ``Status``) to a request of ours (``owns``)."""
        entry = self._pending.pop((node, id(request)), None)
        if entry is None or self.finished:
            return []
        key = entry[0]
        status = reply if isinstance(reply, Status) else getattr(reply, "status", Status.BADMSG)
        kind = key[0]
        if kind == "digest" and status is Status.PREEMPTED:
            self.stopped = True  # a newer sequencer sealed the node: it purges instead
            self._pending.clear()
            self._retry.clear()
            return []
        if status is Status.OK and kind == "state" and type(reply) is LogState:
            self._backoff_ms.pop(node, None)
            return self._on_state(node, reply)
        if status is Status.OK and kind == "digest" and type(reply) is Digest:
            self._backoff_ms.pop(node, None)
            return self._on_digest(node, key, reply)
        if type(reply) is Cleaned and kind == "clean" and status in (
                Status.OK, Status.PREEMPTED):
            # PREEMPTED: the node is sealed above the CLEAN's seal epoch, and purged all the
            # same (``StoreMachine.clean_status``).
            self._backoff_ms.pop(node, None)
            return self._on_cleaned(node, Epoch(key[2]))
        if self._wanted(key):
            delay_ms = self._backoff_ms.get(node, self.config.recovery_retry_ms)
            self._backoff_ms[node] = min(delay_ms * 2, PURGE_RETRY_MS_MAX)
            self._retry.append((now_ms + delay_ms, node, key, request))
        return []

    # ---- steps ---------------------------------------------------------------------------

    def _request(self, node: NodeId, key: Any, message: Any) -> Send:
        self._pending[(node, id(message))] = (key, message)
        return Send(node, message)

    def _wanted(self, key: Any) -> bool:
        kind = key[0]
        if kind == "digest":
            return (key[1], key[2]) in self._derivations
        return key[1] in self._left

    def _on_state(self, node: NodeId, reply: LogState) -> list[Any]:
        cleaned = self._cleaned.get(node, set())
        unsettled = [(Epoch(e), lng, last) for e, lng, last in unsettled_from_wire(
            reply.unclean) if e < self.epoch and e not in cleaned]
        if not unsettled:
            self._left.discard(node)
            return []
        effects: list[Any] = []
        for epoch, lng, last in unsettled:
            self._open.setdefault(node, set()).add(epoch)
            clean = self.known.get(epoch)
            if clean is not None:
                effects.append(self._send_clean(node, clean))
            elif len(self.nodeset) - 1 < self.f_majority:
                # R = 1: no f-majority without the node itself, whose copies are in question;
                # with one copy per record there are no strays to settle anyway.
                self._open[node].discard(epoch)
                self._cleaned.setdefault(node, set()).add(epoch)
            else:
                derivation = _Derivation(node, epoch, lng, last)
                self._derivations[(node, epoch)] = derivation
                effects.extend(self._request(source, ("digest", node, epoch),
                                             self._digest(epoch, lng + 1))
                               for source in self.nodeset if source != node)
        if not self._open.get(node):
            self._left.discard(node)
        return effects

    def _digest(self, epoch: Epoch, from_esn: int) -> GetDigest:
        return GetDigest(log_id=self.log_id, epoch=epoch, from_esn=Esn(from_esn),
                         seal_epoch=Epoch(self.epoch - 1), records_max=PURGE_DIGEST_RECORDS_MAX,
                         bytes_max=PURGE_DIGEST_BYTES_MAX)

    def _on_digest(self, source: NodeId, key: Any, reply: Digest) -> list[Any]:
        derivation = self._derivations.get((key[1], key[2]))
        if derivation is None:
            return []
        best = derivation.best
        past_range = False
        for entry in reply.entries:
            if type(entry) is not tuple or len(entry) < 3 or not (
                    type(entry[0]) is int and type(entry[1]) is int and type(entry[2]) is int):
                continue  # malformed (untrusted): not evidence of anything
            esn, flags, wave = entry[0], entry[1], entry[2]
            if esn > derivation.last:
                past_range = True
                continue
            if esn <= derivation.lng:
                continue
            precedence = copy_precedence(flags, wave)
            current = best.get(esn)
            if current is None or precedence > current[0]:
                best[esn] = (precedence, flags)
        derivation.more_after = derivation.more_after or past_range
        # Paged until the range is covered and the node's next copy, if any, is seen: it
        # tells whether the epoch goes on past the range.
        if reply.entries and not past_range and type(reply.next_esn) is int and (
                derivation.lng < reply.next_esn <= ESN_MAX):
            return [self._request(source, key, self._digest(derivation.epoch,
                                                            reply.next_esn))]
        if reply.non_authoritative:
            # It may have lost copies there: what it holds counts, its silence does not
            # (``shared.authority``); without enough nodes that vouch the node stays unsettled.
            return []
        derivation.complete.add(source)
        if len(derivation.complete) < self.f_majority:
            return []
        del self._derivations[(key[1], key[2])]
        self._pending = {k: v for k, v in self._pending.items() if v[0] != key}
        self._retry = [item for item in self._retry if item[2] != key]
        return [self._send_clean(derivation.target, derived_clean(
            derivation, log_id=self.log_id, sealed_by=self.node_id,
            fallback_wave=recovery_wave(self.epoch - 1, 0)))]

    def _send_clean(self, node: NodeId, clean: Clean) -> Send:
        self.cleans_sent += 1
        return self._request(node, ("clean", node, clean.epoch), clean)

    def _on_cleaned(self, node: NodeId, epoch: Epoch) -> list[Any]:
        self._cleaned.setdefault(node, set()).add(epoch)
        open_epochs = self._open.get(node, set())
        open_epochs.discard(epoch)
        if open_epochs:
            return []
        # Ask again: the node lists a bounded number of epochs per answer; epochs cleaned
        # already are not asked about twice, so this ends.
        return [self._request(node, ("state", node), GetLogState(log_id=self.log_id))]


def derived_clean(derivation: _Derivation, *, log_id: LogId, sealed_by: NodeId,
                  fallback_wave: int) -> Clean:
    """The CLEAN of ``derivation.epoch`` for the range ``lng + 1 .. last`` of its target,
    from the best copies an f-majority of the other nodes hold there (module docstring): the
    first winning bridge, and every ESN below it whose best copy is a hole or that none of
    them holds. Without a bridge in the range and with no copy past it, the epoch ends in the
    range: right after its last record, as a reader of those nodes sees it (a bridge there,
    which covers the rest). It writes with the precedence of the decision it read (the
    highest recovery copy among the winners), or, with none in the range, ``fallback_wave``."""
    best = derivation.best
    bridges = [esn for esn, (_, flags) in best.items() if flags & RecordFlags.BRIDGE]
    bridge = min(bridges) if bridges else 0
    if not bridge and not derivation.more_after:
        last_record = max((esn for esn, (_, flags) in best.items()
                           if not flags & RecordFlags.HOLE), default=derivation.lng)
        bridge = last_record + 1 if last_record < derivation.last else 0
    end = min(bridge - 1 if bridge else derivation.last, derivation.last)
    holes: list[tuple[int, int]] = []

    def plug(first: int, last: int) -> None:
        if first > last:
            return
        if holes and holes[-1][1] == first - 1:
            holes[-1] = (holes[-1][0], last)
        else:
            holes.append((first, last))

    # Every ESN of the range up to the bridge that holds no record among the winners: runs
    # between the winners, and the winners that are holes (linear in the copies read).
    after = derivation.lng
    for esn in sorted(e for e in best if e <= end):
        plug(after + 1, esn - 1)
        if best[esn][1] & RecordFlags.HOLE:
            plug(esn, esn)
        after = esn
    plug(after + 1, end)
    waves = [precedence[1] for precedence, _ in best.values() if precedence[0]]
    wave = max(waves) if waves else fallback_wave
    return Clean(log_id=log_id, epoch=derivation.epoch, seal_epoch=Epoch(seal_epoch_of_wave(wave)),
                 sealed_by=sealed_by, bridge_esn=Esn(bridge), holes=tuple(holes),
                 attempt=wave & RECOVERY_ATTEMPT_MAX)


def unsettled_from_wire(unclean: Any) -> list[tuple[int, int, int]]:
    """The well-formed entries of a node's ``LogState.unclean`` (untrusted), at most
    ``PURGE_EPOCHS_PER_ANSWER_MAX``: valid epochs and ESNs, ``lng < last``."""
    if type(unclean) is not tuple:
        return []
    return [t for t in unclean[:PURGE_EPOCHS_PER_ANSWER_MAX]
            if type(t) is tuple and len(t) == 3 and all(type(x) is int for x in t)
            and epoch_valid(t[0]) and 0 <= t[1] < t[2] <= ESN_MAX]

"""One round of a log read, pure: a READ to every node of an epoch span's nodeset, and the
decision of when the answers suffice to merge (``shared.read_merge``).

Both readers use it: the node serving ``GET /v1/logs/{id}/records`` and the client's reader
that reads storage nodes directly, so curl users and the client see the same log.

A round merges once an f-majority of the nodeset has answered (every record is then seen at
least once) and either every node answered or ``speculative_delay_ms`` has passed since the
f-majority did: a slow node delays a read by that much, not by its own latency (DistributedLog's
speculative reads, in a send-to-all form). A round that can no longer reach an f-majority
ends ``SHORT``; the reader waits and asks again rather than skip anything.

Only answers authoritative at the cursor count toward that f-majority (``shared.authority``):
a node that may have lost copies there is asked, and what it holds is merged, but one more
node is asked for it. When every node of the nodeset answered, their answers are merged
whatever they vouch for (what none of them holds is truly gone); a round that can reach
neither ends ``SHORT``.

A long-poll round (``wait_ms > 0``) merges as soon as an f-majority has answered with
records (or gaps) past the cursor, without waiting for the nodes that still hold the READ: the
storage nodes answer a held READ the moment a release reaches them, so the first answers carry
what a tailing reader waits for. Otherwise it ends ``RELEASE_MOVED`` as soon as one node
reports a release pointer above the one the round carried while others are still holding the
READ: nodes outside the newest records' copysets learn the release late, so the reader asks
again at once, handing every node the newer pointer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from shared.authority import checked, covers
from shared.epoch_metadata import LogMetadata
from shared.read_merge import BlockCache, Merged, NodeAnswer, expand_blocks, f_majority, merge
from shared.status import Status
from shared.types import (
    EPOCH_MAX,
    EPOCH_MIN,
    ESN_INVALID,
    LSN_MAX,
    Epoch,
    LogId,
    Lsn,
    NodeId,
    compose_lsn,
)
from shared.wire.read import Read, ReadReply

RoundEnd = Literal["MERGED", "RELEASE_MOVED", "SHORT"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodesetSpan:
    """Epochs ``first_epoch .. last_epoch`` of a log, stored on ``nodeset`` with R copies."""

    first_epoch: Epoch
    last_epoch: Epoch
    nodeset: tuple[NodeId, ...]
    replication_factor: int

    @property
    def until_lsn(self) -> Lsn:
        """The last LSN a READ of this span covers: slot 0 of the epoch after the span, so that
        whatever its last epoch did not fill ends in a BRIDGE gap, as at any epoch change."""
        if self.last_epoch >= EPOCH_MAX:
            return LSN_MAX
        return compose_lsn(Epoch(self.last_epoch + 1), ESN_INVALID)

    def __post_init__(self) -> None:
        assert 1 <= self.first_epoch <= self.last_epoch <= EPOCH_MAX, self
        assert self.nodeset and 1 <= self.replication_factor <= len(self.nodeset), self


def metadata_spans(metadata: LogMetadata, moved: frozenset[NodeId] = frozenset(),
                   storage_nodes: tuple[NodeId, ...] = ()) -> list[NodesetSpan]:
    """The log's nodeset spans: one per epoch range of its metadata, each read from the nodes
    that hold its copies. ``moved``: storage nodes whose copies were all re-replicated
    elsewhere (DRAINED or REMOVED in the cluster state); ``storage_nodes``: every storage node
    of the cluster.

    A drain's donors send a moved node's copies to other storage nodes, not necessarily of the
    same nodeset, so a span that held a moved node is read from its nodeset plus every other
    storage node, without the moved ones: its records have R copies there, so every
    f-majority of that set holds one (reading a superset of where the copies are is always
    correct; it only asks more nodes). A span whose nodeset is every storage node (the
    default) simply loses the moved nodes. A span that would keep fewer than R nodes is left
    as recorded.

    The last span ends at the last epoch the metadata handed out (``next_epoch - 1``): the
    next activation may put later epochs on a larger nodeset (storage nodes added), where an
    f-majority of this one could miss every copy of a record. A reader past the last span
    (``beyond_spans``) reads the metadata again; by then it covers the epoch, whose nodeset
    was stored before anything was released in it."""
    spans: list[NodesetSpan] = []
    ranges = metadata.nodeset_ranges()
    known = Epoch(max(metadata.next_epoch - 1, ranges[-1].first_epoch, EPOCH_MIN))
    for index, item in enumerate(ranges):
        last = (known if index + 1 == len(ranges)
                else Epoch(ranges[index + 1].first_epoch - 1))
        if last < item.first_epoch:
            continue
        nodeset = item.nodeset
        if moved and not moved.isdisjoint(nodeset):
            wider = tuple(n for n in dict.fromkeys((*nodeset, *storage_nodes))
                          if n not in moved)
            if len(wider) >= item.replication_factor:
                nodeset = wider
        spans.append(NodesetSpan(first_epoch=Epoch(max(item.first_epoch, EPOCH_MIN)),
                                 last_epoch=last, nodeset=nodeset,
                                 replication_factor=item.replication_factor))
    return spans


def nodes_of_epochs(spans: list[NodesetSpan], first_epoch: Epoch,
                    last_epoch: Epoch) -> tuple[NodeId, ...]:
    """Every node of the spans that cover any of ``first_epoch .. last_epoch``, in order."""
    nodes: dict[NodeId, None] = {}
    for span in spans:
        if span.first_epoch <= last_epoch and span.last_epoch >= first_epoch:
            nodes.update(dict.fromkeys(span.nodeset))
    return tuple(nodes)


def beyond_spans(spans: list[NodesetSpan], lsn: Lsn) -> bool:
    """Whether ``lsn`` lies past every span: its epoch's nodeset is not known from them yet
    (see ``metadata_spans``); the reader fetches the metadata again before reading it."""
    return lsn > spans[-1].until_lsn


def span_of(spans: list[NodesetSpan], lsn: Lsn) -> NodesetSpan:
    """The span holding ``lsn``; LSNs before the first span belong to it (epoch 0 and 1 hold
    nothing readers could miss)."""
    for span in spans:
        if lsn <= span.until_lsn:
            return span
    return spans[-1]


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundResult:
    end: RoundEnd
    release_lsn: Lsn
    """The highest release pointer any answer (or the round itself) carried."""
    merged: Merged | None = None
    """For MERGED: records and gaps from ``from_lsn`` on."""
    answered: int = 0
    needed: int = 0
    failures: tuple[tuple[NodeId, Status], ...] = ()


class ReadRound:
    __slots__ = ("_answers", "_asked", "_blocks", "_bytes_max", "_failed", "_order",
                 "_quorum_ms",
                 "_records_max", "_speculative_delay_ms", "_started_ms", "_unsure", "request",
                 "span")

    def __init__(self, *, log_id: LogId, span: NodesetSpan, from_lsn: Lsn, release_lsn: Lsn,
                 records_max: int, bytes_max: int, wait_ms: int, speculative_delay_ms: int,
                 started_ms: int, order: Sequence[NodeId] = ()) -> None:
        """``order``: the nodes to ask first (the rest of the nodeset follows in its order)."""
        self.span = span
        self.request = Read(log_id=log_id, from_lsn=from_lsn,
                            until_lsn=Lsn(max(span.until_lsn, from_lsn)),
                            release_lsn=release_lsn, records_max=records_max,
                            bytes_max=bytes_max, wait_ms=wait_ms)
        self._records_max = records_max
        self._bytes_max = bytes_max
        self._speculative_delay_ms = speculative_delay_ms
        self._started_ms = started_ms
        first = [n for n in order if n in span.nodeset]
        self._order = [*dict.fromkeys(first), *(n for n in span.nodeset if n not in first)]
        self._asked: list[NodeId] = []
        self._answers: dict[NodeId, NodeAnswer] = {}
        self._failed: dict[NodeId, Status] = {}
        self._quorum_ms: int | None = None
        self._blocks: BlockCache = {}
        self._unsure = False
        """Some answer carries non-authoritative ranges (rare: a damaged node)."""

    @property
    def needed(self) -> int:
        return f_majority(len(self.span.nodeset), self.span.replication_factor)

    def _inflight(self) -> int:
        return len(self._asked) - len(self._answers) - len(self._failed)

    def _vouching(self) -> int:
        """Answers authoritative at the cursor: the ones that count toward the f-majority."""
        if not self._unsure:
            return len(self._answers)  # the usual case: every node vouches for everything
        from_lsn = self.request.from_lsn
        return sum(1 for a in self._answers.values()
                   if not a.non_authoritative or not covers(a.non_authoritative, from_lsn))

    def _decided(self) -> bool:
        """Enough answers to merge: an authoritative f-majority, or every node's."""
        return (self._vouching() >= self.needed
                or len(self._answers) == len(self._order))

    def _merge(self, release: Lsn) -> Merged:
        complete = not self._unsure or len(self._answers) == len(self._order)
        return merge(list(self._answers.values()), self.request.from_lsn, release,
                     self._records_max, self._bytes_max, 0 if complete else self.needed)

    def to_ask(self, now_ms: int) -> list[NodeId]:
        """Nodes to send the READ to now (each once). A catch-up round asks an f-majority
        first, one more node per failure, and the rest once ``speculative_delay_ms`` passed
        without enough answers; a long-poll round asks every node at once (a node holding
        the READ cannot be told from a slow one)."""
        unasked = [n for n in self._order if n not in self._asked]
        if not unasked:
            return []
        vouching = self._vouching()
        if vouching >= self.needed:
            return []
        if self.request.wait_ms > 0 or now_ms >= self._started_ms + self._speculative_delay_ms:
            chosen = unasked
        else:
            chosen = unasked[:max(self.needed - vouching - self._inflight(), 0)]
        self._asked.extend(chosen)
        return chosen

    def stragglers(self) -> list[NodeId]:
        """Nodes asked that failed or had not answered: a reader asks them last next time."""
        return [n for n in self._asked if n not in self._answers]

    def on_reply(self, node: NodeId, reply: object, now_ms: int) -> None:
        """A node's READ_REPLY, or the ``Status`` that ended its request."""
        if node in self._answers or node in self._failed or node not in self._asked:
            return
        if type(reply) is ReadReply and reply.status is Status.OK:
            # Compressed batches are expanded here: readers see plain per-LSN records.
            records = expand_blocks(reply.blocks, reply.records, self._blocks)
            unsure = checked(reply.non_authoritative) if reply.non_authoritative else ()
            if records is None or unsure is None:
                self._failed[node] = Status.BADMSG
                return
            self._answers[node] = NodeAnswer(
                records=records, next_lsn=reply.next_lsn, release_lsn=reply.release_lsn,
                markers=reply.markers, trim_lsn=reply.trim_lsn, non_authoritative=unsure)
            self._unsure = self._unsure or bool(unsure)
            if self._quorum_ms is None and self._decided():
                self._quorum_ms = now_ms
        else:
            status = reply.status if type(reply) is ReadReply else reply
            self._failed[node] = status if isinstance(status, Status) else Status.BADMSG

    def wake_ms(self) -> int | None:
        """When ``to_ask`` or ``result`` may change without another reply: the end of the
        speculative delay (since the start, or since the f-majority answered)."""
        if self._quorum_ms is not None:
            return self._quorum_ms + self._speculative_delay_ms if self._inflight() else None
        if len(self._asked) < len(self._order):
            return self._started_ms + self._speculative_delay_ms
        return None

    def result(self, now_ms: int) -> RoundResult | None:
        """How the round ends now, or None to wait for more replies (or ``wake_ms``)."""
        answered = len(self._answers)
        release = Lsn(max([self.request.release_lsn,
                           *(a.release_lsn for a in self._answers.values())]))
        inflight = self._inflight()
        unasked = len(self._order) - len(self._asked)
        decided = self._decided()
        if not decided and self._vouching() + inflight + unasked < self.needed and (
                self._failed):
            # Neither an authoritative f-majority nor every node's answer can come any more.
            return RoundResult(end="SHORT", release_lsn=release, answered=answered,
                               needed=self.needed, failures=tuple(self._failed.items()))
        if inflight and self.request.wait_ms > 0:
            if decided:
                # The nodes still holding the READ are not slow, they wait for a release
                # that has reached others: an f-majority that brought records past the
                # cursor is merged now, not after them nor after another round trip.
                merged = self._merge(release)
                if merged.next_lsn > self.request.from_lsn:
                    return RoundResult(end="MERGED", release_lsn=release, merged=merged,
                                       answered=answered, needed=self.needed)
            if release > self.request.release_lsn:
                return RoundResult(end="RELEASE_MOVED", release_lsn=release,
                                   answered=answered, needed=self.needed)
        if not decided or (
                inflight and self._quorum_ms is not None
                and now_ms < self._quorum_ms + self._speculative_delay_ms):
            return None
        merged = self._merge(release)
        return RoundResult(end="MERGED", release_lsn=release, merged=merged, answered=answered,
                           needed=self.needed)

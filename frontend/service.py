"""``FrontEnd``: the node's implementation of ``LogService``, behind the HTTP edge, the binary
client protocol and the CLI.

It routes each append to the log's sequencer node (weighted rendezvous hashing over the
sequencer nodes the gossip failure detector reports ALIVE), runs it on the local sequencer
runtime, forwards it over the node-to-node transport or, when the client asks with
``no_forward``, redirects the client to the owner; and it serves reads by asking the log's
storage nodes for released records and merging their answers.

Views of different nodes may disagree for a moment. A forwarded append goes at most
``FORWARD_HOPS_MAX`` hops; the node where it lands then runs it even if its own view names
another owner, which breaks forwarding loops. Two sequencers of one log are safe: the newer
epoch seals the older one's storage nodes, which answer it PREEMPTED.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Literal, TypeVar

from frontend.outcomes import (
    AppendOutcome,
    GapOut,
    LsnOutcome,
    NodeOut,
    NodesetOut,
    NodesetsOutcome,
    ReadOutcome,
    RecordOut,
    TailOutcome,
)
from frontend.ports import AppendAnswer, LocalSequencer, MembershipView
from frontend.trim_spread import TrimSpreader
from shared.append_validation import check_append, check_compressed_append
from shared.config import ClusterConfig, ProcessConfig
from shared.epoch_metadata import LogMetadata
from shared.http_contract import wants_retry_after
from shared.limits import READ_WAIT_MS_MAX
from shared.net.nodeset_call import STORAGE_CALL_TIMEOUT_MS, ask_nodeset, ask_nodeset_by_node
from shared.net.pool import PeerPool
from shared.net.read_driver import run_round
from shared.net.types import ReplyFn
from shared.ports import EpochStore
from shared.read_merge import f_majority
from shared.read_round import NodesetSpan, ReadRound, metadata_spans, span_of
from shared.routing import routable_sequencers, sequencer_for
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId, lsn_to_epoch
from shared.wire.append import Append, Appended, GetSequencerState, SequencerState
from shared.wire.codec import Message
from shared.wire.hello import PROTOCOL_VERSION
from shared.wire.read import GetLogState, LogState
from shared.wire.trim import FindTime, FoundTime, Trim, Trimmed

log = logging.getLogger(__name__)

FORWARD_HOPS_MAX = 2
READ_POLL_INTERVAL_S = 0.02
"""Pause between long-poll read rounds only when the storage nodes did not hold the READ."""
LOG_APPEAR_POLL_S = 0.1
"""How often a long poll on a log never written asks the epoch store whether it exists yet."""
SEQUENCER_STATE_TIMEOUT_MS = 1_000
TAIL_READY_WAIT_MS = 2_000
"""How long a tail request waits for a NOTREADY log to become ready (``tail_ready``)."""
TAIL_RETRY_PAUSE_MS_MIN = 10
TAIL_RETRY_PAUSE_MS_MAX = 200
T = TypeVar("T")
OWNERS_CACHED_MAX = 100_000
"""Logs whose owner ``NodeService.owner`` remembers; the cache starts over past it."""
RELEASES_REMEMBERED_MAX = 100_000
"""Logs whose highest reported release pointer a node remembers (oldest forgotten first)."""
_STATE_NAMES: dict[str, Literal["ALIVE", "SUSPECT", "DEAD"]] = {
    "ALIVE": "ALIVE", "SUSPECT": "SUSPECT", "DEAD": "DEAD"}


class FrontEnd:
    def __init__(
        self,
        *,
        config: ProcessConfig,
        pool: PeerPool,
        sequencer: LocalSequencer | None,
        epoch_store: EpochStore,
        gossip: MembershipView | None = None,
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.cluster_name = config.cluster.cluster_name
        self.cluster_fingerprint = pool.cluster_fingerprint
        self.pool = pool
        self.sequencer = sequencer
        self.epoch_store = epoch_store
        self.started = False
        self._metadata: dict[LogId, LogMetadata] = {}
        self._moved: frozenset[NodeId] = frozenset()
        self._release_seen: dict[LogId, Lsn] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._trims = TrimSpreader(pool)
        """Trims owed to storage nodes that missed them."""
        self.gossip = gossip
        self._sequencer_weights = [
            (n.node_id, n.sequencer_weight) for n in config.cluster.sequencer_nodes
        ]
        self._routable = list(self._sequencer_weights)
        self._owners: dict[LogId, NodeId | None] = {}
        """``owner()`` answers for the current ``_routable`` list (hashing every sequencer
        node per append costs more than the rest of routing); emptied when it changes."""
        if gossip is not None:
            gossip.subscribe(self._on_view)

    def set_moved_nodes(self, moved: frozenset[NodeId]) -> None:
        """Storage nodes whose copies were all moved elsewhere (DRAINED, REMOVED in the
        cluster state, from ``services.shard_watch``): epoch spans that held them are read
        where their copies are now (``shared.read_round.metadata_spans``)."""
        self._moved = moved

    def _spans(self, metadata: LogMetadata) -> list[NodesetSpan]:
        return metadata_spans(metadata, self._moved, self.config.cluster.storage_node_ids)

    def _all_nodes(self, metadata: LogMetadata) -> tuple[NodeId, ...]:
        """Every node that holds copies of some epoch of the log: the union of its spans'
        nodesets (f-majorities over it are f-majorities of each span's superset)."""
        return tuple(dict.fromkeys(n for span in self._spans(metadata) for n in span.nodeset))

    def update_cluster(self, cluster: ClusterConfig) -> None:
        """Nodes were added or reweighted (services.membership): route with the new weights."""
        self.config = replace(self.config, cluster=cluster)
        self._sequencer_weights = [(n.node_id, n.sequencer_weight)
                                   for n in cluster.sequencer_nodes]
        if self.gossip is not None:
            self._on_view(self.gossip.view())
        else:
            self._set_routable(list(self._sequencer_weights))

    def _on_view(self, view: Mapping[NodeId, str]) -> None:
        self._set_routable(routable_sequencers(self._sequencer_weights, view))

    def _set_routable(self, routable: list[tuple[NodeId, float]]) -> None:
        if routable != self._routable:
            self._routable = routable
            self._owners.clear()

    def owner(self, log_id: LogId) -> NodeId | None:
        owners = self._owners
        if log_id in owners:
            return owners[log_id]
        owner = sequencer_for(log_id, self._routable)
        if len(owners) >= OWNERS_CACHED_MAX:
            owners.clear()
        owners[log_id] = owner
        return owner

    # ---- appends -------------------------------------------------------------------------

    def append_nowait(
        self, log_id: LogId, payloads: tuple[bytes, ...], key: str | None, *,
        producer: tuple[str, int] | None = None, no_forward: bool = False,
        done: Callable[[AppendOutcome], None], compression: int = 0, records: int = 0,
        local_done: Callable[[AppendAnswer], None] | None = None,
    ) -> None:
        """``append`` with a callback instead of a coroutine: no Task and no future per
        append. ``done`` gets the outcome exactly once; answers known at once (a redirect, no
        sequencer node, shutting down) call it before this returns. The caller has validated
        the append (``shared.append_validation``). ``compression``/``records``: ``payloads``
        is one compressed batch (``shared.compression``) of ``records`` records.
        ``local_done``: instead of ``done``, takes the answer of an append this node's own
        sequencer runs, as it is (sequenced by ``node_id``; no ``AppendOutcome`` in between)."""
        sequencer = self.sequencer
        if (local_done is not None and sequencer is not None
                and self.owner(log_id) == self.node_id):
            # The hot case in one step: this node sequences the log (``_append_nowait``).
            sequencer.append_nowait(log_id, payloads, key, producer, local_done,
                                    compression=compression, records=records)
            return
        if no_forward:
            redirect = self._redirect(log_id)
            if redirect is not None:
                done(redirect)
                return
        self._append_nowait(log_id, payloads, key, producer, 0, done, local_done,
                            compression=compression, records=records)

    async def append(
        self, log_id: LogId, payloads: tuple[bytes, ...], key: str | None, *,
        producer: tuple[str, int] | None = None, no_forward: bool = False,
        compression: int = 0, records: int = 0,
    ) -> AppendOutcome:
        """``producer``: ``(producer_id, producer_seq)`` of an idempotent append.
        ``compression``/``records``: a validated compressed batch (``LogService.append``)."""
        future: asyncio.Future[AppendOutcome] = asyncio.get_running_loop().create_future()

        def done(outcome: AppendOutcome) -> None:
            if not future.done():
                future.set_result(outcome)

        self.append_nowait(log_id, payloads, key, producer=producer, no_forward=no_forward,
                           done=done, compression=compression, records=records)
        return await future

    def _redirect(self, log_id: LogId) -> AppendOutcome | None:
        """The NOSEQUENCER answer naming the log's owner, unless this node is the owner (or
        no sequencer node is alive: then ``_append_nowait`` answers)."""
        owner = self.owner(log_id)
        if owner is None or owner == self.node_id:
            return None
        node = self.config.cluster.node(owner)
        assert node is not None
        return AppendOutcome(
            status=Status.NOSEQUENCER, sequencer_node=owner, redirect_http=node.http_address,
            redirect_data=f"{node.host}:{node.data_port}",
            message=f"node {self.node_id} does not sequence log {log_id}; "
                    f"its sequencer is {owner} ({node.http_address})")

    def _append_nowait(
        self, log_id: LogId, payloads: tuple[bytes, ...], key: str | None,
        producer: tuple[str, int] | None, hops: int, done: Callable[[AppendOutcome], None],
        local_done: Callable[[AppendAnswer], None] | None = None, *, compression: int = 0,
        records: int = 0,
    ) -> None:
        """``local_done``: takes the local sequencer's answer as it is (no ``AppendOutcome``
        in between), when the append runs here; ``done`` gets every other outcome."""
        owner = self.owner(log_id)
        if owner is None:
            done(AppendOutcome(status=Status.NOSEQUENCER, message="no sequencer node is alive"))
            return
        sequencer = self.sequencer
        # A node whose sequencer of the log is active takes appends forwarded to it even if
        # its view of the owner differs: that breaks redirect loops between views.
        if (owner == self.node_id or hops >= FORWARD_HOPS_MAX
                or (hops > 0 and sequencer is not None and sequencer.is_active(log_id))):
            if sequencer is None:
                done(AppendOutcome(status=Status.NOSEQUENCER,
                                   message=f"node {self.node_id} has no sequencer role"))
                return
            if local_done is not None:
                sequencer.append_nowait(log_id, payloads, key, producer, local_done,
                                        compression=compression, records=records)
                return
            node_id = self.node_id

            def on_result(r: AppendAnswer) -> None:
                done(AppendOutcome(status=r.status, first_lsn=r.first_lsn,
                                   last_lsn=r.last_lsn, timestamp_ms=r.timestamp_ms,
                                   sequencer_node=node_id, message=r.message))

            sequencer.append_nowait(log_id, payloads, key, producer, on_result,
                                    compression=compression, records=records)
            return
        self._forward(owner, log_id, payloads, key, producer, hops, done, compression, records)

    def _forward(
        self, owner: NodeId, log_id: LogId, payloads: tuple[bytes, ...], key: str | None,
        producer: tuple[str, int] | None, hops: int, done: Callable[[AppendOutcome], None],
        compression: int = 0, records: int = 0,
    ) -> None:
        producer_id, producer_seq = producer if producer is not None else (None, 0)

        def on_reply(reply: Message | Status) -> None:
            done(_forward_outcome(owner, reply))

        self.pool.request(
            owner, Append(log_id=log_id, payloads=payloads, key=key, hops=hops + 1,
                          producer_id=producer_id, producer_seq=producer_seq,
                          compression=compression, records=records),
            on_reply, timeout_ms=self.config.sequencer.append_timeout_ms + 1_000)

    def on_append_message(self, message: Append, reply: ReplyFn) -> None:
        """An APPEND from a binary client (``hops`` 0, which the transport enforces) or
        forwarded by another node. Both are checked like HTTP appends: a bad APPEND must not
        reach the core. A client's ``no_forward`` is honoured; nodes never redirect nodes."""
        producer_id = message.producer_id
        producer_seq = None if producer_id is None else message.producer_seq
        compression, records = message.compression, message.records
        if compression or records:
            invalid = check_compressed_append(
                message.log_id, message.payloads, compression, records, message.key,
                producer_id, producer_seq, self.config.api, entering=message.hops == 0)
        else:
            invalid = check_append(message.log_id, message.payloads, message.key, producer_id,
                                   producer_seq, self.config.api)
        log_id = message.log_id
        if invalid is not None:
            reply(Appended(status=invalid.status, log_id=log_id, first_lsn=Lsn(0),
                           last_lsn=Lsn(0), timestamp_ms=0, sequencer_node=None,
                           message=f"{invalid.message}; nothing written"))
            return

        # Clients are told when to retry, as HTTP's Retry-After does; nodes relay statuses
        # (and get version-1 frames: no extension fields).
        retry_after_ms = self.config.api.retry_after_s * 1000 if message.hops == 0 else 0

        def done(r: AppendOutcome) -> None:
            reply(Appended(status=r.status, log_id=log_id, first_lsn=r.first_lsn,
                           last_lsn=r.last_lsn, timestamp_ms=r.timestamp_ms,
                           sequencer_node=r.sequencer_node, message=r.message,
                           redirect_data=r.redirect_data,
                           retry_after_ms=retry_after_ms if r.status is not Status.OK and (
                               wants_retry_after(r.status)) and r.redirect_data is None
                           else 0))

        node_id = self.node_id

        def local_done(r: AppendAnswer) -> None:
            # The hot path: straight from the local sequencer's answer to the reply.
            status = r.status
            reply(Appended(status=status, log_id=log_id, first_lsn=r.first_lsn,
                           last_lsn=r.last_lsn, timestamp_ms=r.timestamp_ms,
                           sequencer_node=node_id, message=r.message,
                           retry_after_ms=retry_after_ms if status is not Status.OK and (
                               wants_retry_after(status)) else 0))

        if message.no_forward and message.hops == 0:
            redirect = self._redirect(log_id)
            if redirect is not None:
                done(redirect)
                return
        producer = None if producer_id is None else (producer_id, message.producer_seq)
        self._append_nowait(log_id, message.payloads, message.key, producer, message.hops,
                            done, local_done, compression=compression, records=records)

    # ---- reads ---------------------------------------------------------------------------

    async def _log_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        cached = self._metadata.get(log_id)
        if cached is not None:
            return Status.OK, cached
        status, metadata = await self.epoch_store.get_metadata(log_id)
        if status is Status.OK and metadata is not None:
            self._metadata[log_id] = metadata
        return status, metadata

    def _local_release(self, log_id: LogId) -> Lsn:
        return self.sequencer.release_lsn(log_id) if self.sequencer is not None else Lsn(0)

    def sequencer_state(self, log_id: LogId, *, activate: bool = False) -> SequencerState:
        """This node's sequencer of ``log_id``, for peers serving reads of it; ``activate``:
        start activating it if it is not active (the answer still says NOSEQUENCER)."""
        active = self.sequencer is not None and self.sequencer.is_active(log_id)
        if activate and not active and self.sequencer is not None:
            self.sequencer.request_activation(log_id)
        return SequencerState(
            status=Status.OK if active else Status.NOSEQUENCER, log_id=log_id,
            release_lsn=self._local_release(log_id),
            epoch=self.sequencer.epoch(log_id) if self.sequencer is not None else Epoch(0))

    async def _release_hint(self, log_id: LogId) -> Lsn:
        """The freshest release pointer this node can get: its own sequencer's, or the one of
        the log's sequencer node (one small round trip), and never less than one it reported
        before."""
        return (await self._asked_release(log_id))[0]

    async def _asked_release(self, log_id: LogId) -> tuple[Lsn, bool]:
        """``_release_hint`` and whether a sequencer (this node's or the owner) answered."""
        owner = self.owner(log_id)
        if owner is None or owner == self.node_id:
            local = self._local_release(log_id)
            return self._note_release(log_id, local), self.sequencer is not None and (
                self.sequencer.is_active(log_id))
        reply = await self.pool.call(owner, GetSequencerState(log_id=log_id),
                                     SEQUENCER_STATE_TIMEOUT_MS)
        if type(reply) is SequencerState and reply.status is Status.OK:
            return self._note_release(log_id, reply.release_lsn), True
        return self._note_release(log_id, self._local_release(log_id)), False

    def _note_release(self, log_id: LogId, release_lsn: Lsn) -> Lsn:
        """Remember the highest release pointer seen for the log and return it: what this node
        reports never goes backwards, even when the nodes it asks are out of reach."""
        seen = self._release_seen.get(log_id, Lsn(0))
        if release_lsn > seen:
            if log_id not in self._release_seen and len(self._release_seen) >= (
                    RELEASES_REMEMBERED_MAX):
                self._release_seen.pop(next(iter(self._release_seen)))
            self._release_seen[log_id] = release_lsn
            return release_lsn
        return seen

    async def read(
        self, log_id: LogId, from_lsn: Lsn, records_max: int, bytes_max: int, wait_ms: int
    ) -> ReadOutcome:
        """One look at the freshest release pointer (this node's sequencer or one
        GetSequencerState to the owner, so a read right after an acknowledged append sees
        it), then read rounds. While nothing at or after ``from_lsn`` is released, a round
        is a long poll on the storage nodes themselves (``Read.wait_ms``): they hold the READ
        until their release pointer passes ``from_lsn - 1``; a round that ends because one
        node's pointer moved is asked again at once with the newer pointer. No polling loop
        and no sequencer hop per round."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + wait_ms / 1000
        status, metadata = await self._log_metadata(log_id)
        if metadata is None and status is Status.NOTFOUND and wait_ms > 0:
            # A long poll on a log never written waits for its first record: a consumer
            # started before its producers is the normal case (docs/API-EXTENSIONS.md).
            status, metadata = await self._await_log(log_id, deadline_s)
            if metadata is None and status is Status.NOTFOUND:
                return ReadOutcome(status=Status.OK, next_lsn=from_lsn, release_lsn=Lsn(0))
        if metadata is None:
            return ReadOutcome(status=status, message=f"log {log_id}: {status.description}")
        release = await self._release_hint(log_id)
        while True:
            remaining_ms = int((deadline_s - loop.time()) * 1000)
            round_wait_ms = (min(remaining_ms, READ_WAIT_MS_MAX)
                             if release < from_lsn and remaining_ms > 0 else 0)
            started_s = loop.time()
            outcome = await self._read_once(log_id, metadata, from_lsn, records_max,
                                            bytes_max, release, round_wait_ms)
            if not isinstance(outcome, ReadOutcome):
                release = outcome  # RELEASE_MOVED: ask again at once with the newer pointer
                continue
            if outcome.status is not Status.OK or outcome.records or outcome.gaps:
                return outcome
            release = outcome.release_lsn
            remaining_s = deadline_s - loop.time()
            if round_wait_ms == 0 or remaining_s <= 0:
                return outcome
            if loop.time() - started_s < round_wait_ms / 2000:
                # The storage nodes answered long before the wait ran out without anything
                # new (they hold a bounded number of READs): pause instead of spinning.
                await asyncio.sleep(min(READ_POLL_INTERVAL_S, remaining_s))

    async def _await_log(self, log_id: LogId, deadline_s: float
                         ) -> tuple[Status, LogMetadata | None]:
        """The log's metadata once its first append provisions it, or ``NOTFOUND`` at
        ``deadline_s``: the epoch store is asked every ``LOG_APPEAR_POLL_S``."""
        loop = asyncio.get_running_loop()
        while True:
            remaining_s = deadline_s - loop.time()
            if remaining_s <= 0:
                return Status.NOTFOUND, None
            await asyncio.sleep(min(LOG_APPEAR_POLL_S, remaining_s))
            status, metadata = await self._log_metadata(log_id)
            if status is not Status.NOTFOUND:
                return status, metadata

    async def _read_once(
        self, log_id: LogId, metadata: LogMetadata, from_lsn: Lsn, records_max: int,
        bytes_max: int, release: Lsn, wait_ms: int,
    ) -> ReadOutcome | Lsn:
        """One read round; a ``Lsn`` (the newer release pointer) when a long-poll round ended
        because a storage node's release pointer moved."""
        span = span_of(self._spans(metadata), from_lsn)
        read_round = ReadRound(
            log_id=log_id, span=span, from_lsn=from_lsn, release_lsn=release,
            records_max=records_max, bytes_max=bytes_max, wait_ms=wait_ms,
            speculative_delay_ms=self.config.api.read_speculative_delay_ms,
            started_ms=int(asyncio.get_running_loop().time() * 1000),
            # A random f-majority first spreads readers over the copies.
            order=random.sample(span.nodeset, len(span.nodeset)))
        result = await run_round(self.pool, read_round, STORAGE_CALL_TIMEOUT_MS)
        if result.end == "RELEASE_MOVED":
            return self._note_release(log_id, result.release_lsn)
        if result.merged is None:
            return ReadOutcome(
                status=Status.NOTREADY, next_lsn=from_lsn,
                release_lsn=self._note_release(log_id, release),
                message=f"{result.answered} of {len(span.nodeset)} storage nodes answered; "
                        f"{result.needed} are needed to read without skipping records")
        release = self._note_release(log_id, result.release_lsn)
        merged = result.merged
        return ReadOutcome(
            status=Status.OK,
            records=[RecordOut(lsn=Lsn(r[0]), timestamp_ms=r[1], key=r[2], payload=r[3])
                     for r in merged.records],
            gaps=[GapOut(type=g.kind, lo=g.lo, hi=g.hi) for g in merged.gaps],
            next_lsn=merged.next_lsn, release_lsn=release)

    async def tail_ready(self, log_id: LogId) -> TailOutcome:
        """``tail``, asked again with backoff for up to ``TAIL_READY_WAIT_MS`` while it answers
        NOTREADY: a sequencer that is activating or recovering (the first append to a log, a
        failover) is ready within milliseconds, and the caller should get the tail, not a 503
        to retry, as an append waits for the activation it triggers. Past the bound, or when
        too few storage nodes answer (no wait helps until they are back: a console listing
        many logs must not wait on each), the NOTREADY goes out at once."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + TAIL_READY_WAIT_MS / 1000
        pause_s = TAIL_RETRY_PAUSE_MS_MIN / 1000
        while True:
            outcome = await self.tail(log_id)
            if (outcome.status is not Status.NOTREADY or not outcome.settling
                    or loop.time() + pause_s > deadline_s):
                return outcome
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, TAIL_RETRY_PAUSE_MS_MAX / 1000)

    async def tail(self, log_id: LogId) -> TailOutcome:
        """The log's release pointer, never less than one any node reported before this
        request (consumers use it as a high-water mark, whichever node they ask). Two answers
        can vouch for that:

        - the sequencer's pointer, once its epoch releases (recovery of the earlier epochs
          done, so it covers them) and, asked after it answered, at least R storage nodes
          report no seal of its epoch: R nodes meet every f-majority, so no later epoch's
          sequencer has sealed, let alone released anything; a sequencer that is out of
          reach, still recovering or preempted cannot vouch;
        - with no sequencer active, the tail of the last clean epoch when it is the log's
          latest epoch (a drained or idle-deactivated log): nothing can be released past it
          without a new epoch, and a new epoch would show in the epoch store.

        Otherwise it answers NOTREADY, and, when neither the owner in this node's view nor the
        node that took the latest epoch runs the log, asks the owner to activate it (an
        unclean epoch needs recovery before anyone can tell what it released). Storage
        nodes' durable pointers and what this node reported before only raise the answer."""
        status, metadata = await self._log_metadata(log_id)
        if metadata is None:
            return TailOutcome(status=status, message=f"log {log_id}: {status.description}")
        owner = self.owner(log_id)
        seq_release, seq_epoch, answered = await self._sequencer_view(log_id)
        states = await self._log_states(log_id, metadata.nodeset)
        trim_lsn = Lsn(0)
        stored = Lsn(0)
        sealed = Epoch(0)
        storage_answers = len(states)
        trims: dict[NodeId, Lsn] = {}
        for node, state in states.items():
            stored = max(stored, state.release_lsn)
            trim_lsn = max(trim_lsn, state.trim_lsn)
            sealed = max(sealed, state.sealed_epoch)
            trims[node] = state.trim_lsn
        # A node behind the trim point the others wrote durably missed a trim: it is sent it
        # again, so the trim reaches every node however long it was away.
        self._trims.owe(log_id, trim_lsn, {n for n, t in trims.items() if t < trim_lsn})
        # The epoch store only when the answer needs it: not for a sequencer that already
        # releases in its own epoch (the common case of a tail poll).
        lce = None
        if not answered or lsn_to_epoch(seq_release) != seq_epoch:
            lce_status, lce = await self.epoch_store.get_last_clean_epoch(log_id)
            if lce_status is not Status.OK:
                lce = None
        vouched: Lsn | None = None
        epoch = Epoch(0)
        releasing = False
        if answered and seq_epoch > 0:
            # A recovered sequencer releases at least the recovered tail. A pointer below it
            # was read while the sequencer still recovered (the last clean epoch, read after
            # its answer, moved meanwhile): it is no release, and may be below tails reported
            # before (simulation seed 215).
            releasing = lsn_to_epoch(seq_release) == seq_epoch or (
                lce is not None and lce.epoch >= seq_epoch - 1
                and seq_release >= lce.tail_lsn)
            unsealed = sealed < seq_epoch and storage_answers >= min(
                metadata.replication_factor, len(metadata.nodeset))
            if releasing and unsealed:
                vouched, epoch = seq_release, seq_epoch
        if vouched is None and not answered and lce is not None:
            _, fresh = await self.epoch_store.get_metadata(log_id)
            latest = Epoch(max(fresh.next_epoch - 1, 0)) if fresh is not None else None
            if latest is not None and lce.epoch >= latest:
                vouched, epoch = lce.tail_lsn, latest
        if vouched is None:
            if not answered:
                self._ask_activation(log_id, owner)
            why = ("is not active or is out of reach" if not answered
                   else "was sealed by a newer epoch" if sealed >= seq_epoch
                   else "cannot be confirmed by enough storage nodes" if releasing
                   else "is recovering")
            return TailOutcome(
                status=Status.NOTREADY, sequencer_node=owner,
                settling=not (answered and releasing and sealed < seq_epoch),
                message=f"the sequencer of log {log_id} {why} ({storage_answers} of "
                        f"{len(metadata.nodeset)} storage nodes answered); the tail is not "
                        "known yet: ask again")
        release = self._note_release(log_id, Lsn(max(vouched, stored)))
        return TailOutcome(status=Status.OK, release_lsn=release, trim_lsn=trim_lsn,
                           epoch=epoch, sequencer_node=owner)

    async def _log_states(self, log_id: LogId,
                          nodeset: tuple[NodeId, ...]) -> dict[NodeId, LogState]:
        """GET_LOG_STATE to every node of ``nodeset`` at once: the OK answers, per node."""
        replies: list[Any] = await asyncio.gather(*(
            self.pool.call(node, GetLogState(log_id=log_id), STORAGE_CALL_TIMEOUT_MS)
            for node in nodeset))
        return {node: reply for node, reply in zip(nodeset, replies, strict=True)
                if type(reply) is LogState and reply.status is Status.OK}

    async def _sequencer_view(self, log_id: LogId) -> tuple[Lsn, Epoch, bool]:
        """The release pointer and epoch of the log's active sequencer, and whether one
        answered: the owner in this node's view (itself, or one GetSequencerState), else the
        node that took the log's latest epoch (views disagree for a while after nodes come
        and go: the log may still be active where this node does not expect it)."""
        owner = self.owner(log_id)
        view = await self._ask_sequencer(log_id, owner)
        if view[2]:
            return view
        _, fresh = await self.epoch_store.get_metadata(log_id)
        writer = fresh.last_writer if fresh is not None else None
        if writer is not None and writer != owner and self.config.cluster.node(writer):
            return await self._ask_sequencer(log_id, writer)
        return view

    async def _ask_sequencer(self, log_id: LogId,
                             node: NodeId | None) -> tuple[Lsn, Epoch, bool]:
        sequencer = self.sequencer
        if node is None or node == self.node_id:
            if sequencer is not None and sequencer.is_active(log_id):
                return sequencer.release_lsn(log_id), sequencer.epoch(log_id), True
            return Lsn(0), Epoch(0), False
        reply = await self.pool.call(node, GetSequencerState(log_id=log_id),
                                     SEQUENCER_STATE_TIMEOUT_MS)
        if type(reply) is SequencerState and reply.status is Status.OK:
            return reply.release_lsn, reply.epoch, True
        return Lsn(0), Epoch(0), False

    def _ask_activation(self, log_id: LogId, owner: NodeId | None) -> None:
        """Have the log's sequencer activated (best effort, no answer awaited)."""
        if owner is None or owner == self.node_id:
            if self.sequencer is not None:
                self.sequencer.request_activation(log_id)
            return
        self.pool.send(owner, GetSequencerState(log_id=log_id, activate=True))

    async def nodesets(self, log_id: LogId) -> NodesetsOutcome:
        # Fresh from the epoch store (once per reader, not per read): the spans include any
        # nodeset the log moved to since this node cached its metadata.
        status, metadata = await self.epoch_store.get_metadata(log_id)
        if status is Status.OK and metadata is not None:
            self._metadata[log_id] = metadata
        else:
            status, metadata = await self._log_metadata(log_id)
        if metadata is None:
            return NodesetsOutcome(status=status, message=f"log {log_id}: {status.description}")
        cluster = self.config.cluster
        spans = []
        for span in self._spans(metadata):
            nodes = []
            for node_id in span.nodeset:
                # Every member is listed, so that readers count the whole nodeset for their
                # f-majority; one this node has no address for is listed without one.
                node = cluster.node(node_id)
                nodes.append((node_id, "" if node is None else f"{node.host}:{node.data_port}"))
            spans.append(NodesetOut(first_epoch=span.first_epoch, last_epoch=span.last_epoch,
                                    replication_factor=span.replication_factor,
                                    nodes=tuple(nodes)))
        return NodesetsOutcome(status=Status.OK, nodesets=tuple(spans),
                               cluster_fingerprint=self.pool.cluster_fingerprint,
                               protocol_version=PROTOCOL_VERSION,
                               release_lsn=await self._release_hint(log_id))

    async def find_time(self, log_id: LogId, timestamp_ms: int) -> LsnOutcome:
        """Every record is on R nodes, so among an f-majority's answers (each node's first LSN
        at or after the time, from its index) the lowest is the log's."""
        release = await self._release_hint(log_id)
        asked = await self._ask_f_majority(
            log_id, FindTime(log_id=log_id, timestamp_ms=timestamp_ms), FoundTime)
        if isinstance(asked, LsnOutcome):
            return asked
        found = [r.lsn for r in asked if r.lsn]
        lsn = min(found) if found else Lsn(release + 1)
        return LsnOutcome(status=Status.OK, lsn=Lsn(min(lsn, release + 1)))

    async def trim(self, log_id: LogId, trim_lsn: Lsn) -> LsnOutcome:
        """Raise the trim point on every storage node of the log's nodeset; done once R of
        them (at least an f-majority) have it durably. Every f-majority of the nodeset then
        holds one of them, and readers take the highest trim point any answering node
        reports, so no reader reads below it (with an f-majority alone, two f-majorities can
        be disjoint when ``|nodeset| < 2R - 1``). The nodes that missed it are sent it again
        until they have it (``frontend.trim_spread``)."""
        status, metadata = await self._log_metadata(log_id)
        if metadata is None:
            return LsnOutcome(status=status, message=f"log {log_id}: {status.description}")
        release = await self._release_hint(log_id)
        if trim_lsn > release:
            # This node's view of the owner may be stale (it believes it sequences the log, or
            # the owner it asked is not active): the storage nodes' pointers, which only ever
            # come from a sequencer's release, settle it before the trim is refused.
            # (A tail may say NOTREADY while any durable pointer is a safe bound here.)
            states = await self._log_states(log_id, metadata.nodeset)
            release = max([release, *(state.release_lsn for state in states.values())])
        if trim_lsn > release:
            return LsnOutcome(
                status=Status.INVALID_PARAM,
                message=f"trim point {trim_lsn} is beyond the release pointer {release}")
        nodeset, replication = self._all_nodes(metadata), metadata.replication_factor
        needed = max(f_majority(len(nodeset), replication), replication)
        answers = await ask_nodeset_by_node(
            self.pool, nodeset, Trim(log_id=log_id, trim_lsn=trim_lsn),
            lambda r: type(r) is Trimmed and r.status is Status.OK, needed=needed,
            timeout_ms=STORAGE_CALL_TIMEOUT_MS)
        if answers is None:
            return LsnOutcome(
                status=Status.NOTREADY,
                message=f"fewer than {needed} of {len(nodeset)} storage nodes wrote the trim "
                        "point; retry")
        self._trims.owe(log_id, trim_lsn, set(nodeset) - set(answers))
        return LsnOutcome(status=Status.OK, lsn=Lsn(max(
            a.trim_lsn for a in answers.values() if type(a) is Trimmed)))

    async def _ask_f_majority(self, log_id: LogId, message: Any,
                              answer_type: type[T]) -> list[T] | LsnOutcome:
        """Send ``message`` to every storage node of the log's nodeset: the OK answers, or why
        there are fewer than an f-majority of them (NOTFOUND, NOTREADY; retrying is safe)."""
        status, metadata = await self._log_metadata(log_id)
        if metadata is None:
            return LsnOutcome(status=status, message=f"log {log_id}: {status.description}")
        nodeset = self._all_nodes(metadata)
        answers = await ask_nodeset(
            self.pool, nodeset, metadata.replication_factor, message,
            lambda r: type(r) is answer_type and getattr(r, "status", None) is Status.OK,
            timeout_ms=STORAGE_CALL_TIMEOUT_MS)
        if answers is None:
            needed = f_majority(len(nodeset), metadata.replication_factor)
            return LsnOutcome(
                status=Status.NOTREADY,
                message=f"fewer than {needed} of {len(nodeset)} storage nodes "
                        "answered; retry")
        return [a for a in answers if type(a) is answer_type]

    # ---- cluster -------------------------------------------------------------------------

    def cluster_nodes(self) -> list[NodeOut]:
        """Every configured node with its state in this node's gossip view."""
        view = self.gossip.view() if self.gossip is not None else {}
        return [
            NodeOut(node_id=n.node_id, roles=tuple(n.roles), http=n.http_address,
                    state=_STATE_NAMES[view.get(n.node_id, "ALIVE")],
                    sequencer_weight=n.sequencer_weight,
                    storage_capacity=n.storage_capacity, data=f"{n.host}:{n.data_port}")
            for n in self.config.cluster.nodes
        ]

    def ready(self) -> bool:
        return self.started

    async def close(self) -> None:
        await self._trims.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _forward_outcome(owner: NodeId, reply: Message | Status) -> AppendOutcome:
    """The outcome of an append forwarded to ``owner``, from its answer or the transport's."""
    if type(reply) is Appended:
        return AppendOutcome(status=reply.status, first_lsn=reply.first_lsn,
                             last_lsn=reply.last_lsn, timestamp_ms=reply.timestamp_ms,
                             sequencer_node=reply.sequencer_node, message=reply.message)
    status = reply if isinstance(reply, Status) else Status.BADMSG
    if status is Status.CONNFAILED:
        # The pool never handed it to a connection: nothing was written.
        return AppendOutcome(status=Status.NOSEQUENCER, sequencer_node=owner,
                             message=f"sequencer node {owner} is unreachable")
    if status is Status.OVERLOADED:
        return AppendOutcome(status=status, sequencer_node=owner,
                             message=f"too many appends in flight to {owner}")
    return AppendOutcome(status=Status.TIMEDOUT, sequencer_node=owner,
                         message=f"forwarding to {owner} failed ({status.name}); "
                                 "outcome unknown")

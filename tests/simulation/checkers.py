"""Safety checkers, fed by the simulation as things happen, and the final disk checks.

C1 one LSN, one payload: across every STORE sent, every disk and every acknowledgement.
C2 every acknowledged record was on at least R distinct disks when it was acknowledged, and
   still is at the end (disks survive crashes), except for copies a damaged disk lost and its
   node declared (authoritative status).
C3 no release pointer (a sequencer's or a storage node's) ever passes the fully replicated
   prefix: when it advances to L, every ESN up to L's in L's epoch is on >= R disks, every
   acknowledged LSN <= L is on >= R disks, and every epoch before L's is clean in the epoch
   store (nothing in an epoch over an unclean one is ever released). Pointers never go back.
   A clean epoch's tail covers every LSN ever assigned in that epoch.
C4 appends answered SEQNOBUFS, NOSEQUENCER or NOTFOUND (or never sent to a core) wrote
   nothing: no STORE ever carried their payloads and no disk holds them.
C5 epoch recovery never plugs an acknowledged LSN with a hole, and an epoch marked clean holds
   no acknowledged LSN beyond its tail.
R1 readers agree: at the end, reading each log up to its release pointer from every
   f-majority of its nodeset (``shared.read_merge``) gives the same records and gaps, and
   every acknowledged record among them. Like a real reader, a read that an f-majority cannot
   decide (a member not authoritative there) asks the next node.
R2 readers agree at every moment: every ``reader_check_interval_ms`` during the run, each log
   is read up to the highest release pointer anyone holds, starting from a sample of
   f-majorities (reading like a reader, as R1): they all see the same record or gap at every
   LSN, every acknowledged record among them, and the same as every earlier read saw below
   its release pointer (a record or a gap, once read, never changes).
D1 no acknowledged record is lost when at most R - 1 copies are lost between rebuilds: when
   a replaced disk's rebuild finishes (or a damaged disk's mini-rebuild of the ranges it
   lost), and at the end, every acknowledged record whose copy the disk held is on R disks
   again (copies an unranged damage lost, never rebuilt in the simulation, excepted). With
   R1 and R2 reading along (a rebuilt node vouches for everything again), no LSN reads as
   a record through one f-majority and a gap through another across replacements and
   rebuilds.
D2 a repair never leaves an older version: where a damaged disk's lost copy of an LSN had
   superseded an older copy there (a later wave, a recovery's plug or bridge), so that the
   node holds the older one again, its mini-rebuild writes a copy of at least the lost
   one's precedence (``storage_node.core.rebuild_accept``) before it finishes, as far as
   another disk still holds a copy of that precedence to donate (the best one a donor holds
   otherwise; nothing, where the lost copy was the only one newer than this node's).
T1 the tail never decreases: every frontend (one per sequencer node incarnation, the shipped
   ``FrontEnd.tail`` through the simulated transport, ``sim_frontend``) answers GET tail, and
   every OK answer is at least the highest tail any frontend reported before the request
   started (NOTREADY is always allowed).

Checks are incremental (each LSN is verified once per property) so that they can run at
every event; disks only grow, so what was verified stays true.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import NoReturn

from sequencer.core.effects import AppendReply
from shared.read_merge import NodeAnswer, f_majority, merge
from shared.types import (
    Epoch,
    Esn,
    LogId,
    Lsn,
    NodeId,
    compose_lsn,
    format_lsn,
    lsn_to_epoch,
    lsn_to_esn,
)
from shared.wire.store import RecordFlags, Store, copy_precedence
from tests.simulation.sim_client import ClientAppend, store_payloads
from tests.simulation.sim_storage import DiskRecord, SimStorageNode

CHECKER_NAMES = {
    "C1": "one LSN, one payload",
    "C2": "acknowledged means stored on R nodes",
    "C3": "release only over the fully replicated prefix of clean epochs",
    "C4": "nothing-written answers wrote nothing",
    "C5": "recovery keeps every acknowledged record",
    "R1": "readers through any f-majority agree and see every acknowledged record",
    "R2": "at every moment, readers through any f-majority see the same record or gap at "
          "every released LSN, and what was read never changes",
    "D1": "no acknowledged record lost when at most R - 1 copies are lost between rebuilds",
    "D2": "a repaired node never keeps an older version of a copy it lost",
    "T1": "the tail never decreases",
    "L1": "liveness: quiescent after healing",
    "L2": "liveness: appends after healing succeed and get released",
    "CORE": "a core's own assertion",
    "TEST": "a scenario's own expectation",
}

Key = tuple[LogId, Lsn]


class CheckFailed(AssertionError):
    """A checker fired. ``checker`` is one of ``CHECKER_NAMES``."""

    def __init__(self, checker: str, detail: str) -> None:
        super().__init__(f"checker {checker} ({CHECKER_NAMES[checker]}): {detail}")
        self.checker = checker
        self.detail = detail


def fail(checker: str, detail: str) -> NoReturn:
    raise CheckFailed(checker, detail)


class SafetyChecker:
    def __init__(
        self,
        *,
        replication_of: Callable[[LogId], int],
        clean_epoch_of: Callable[[LogId], Epoch],
    ) -> None:
        self._replication_of = replication_of
        self._clean_epoch_of = clean_epoch_of
        self.assigned: dict[Key, bytes] = {}
        """The payload of every LSN any sequencer ever put in a STORE."""
        self.copies: dict[Key, set[NodeId]] = {}
        """Storage nodes whose disk holds the assigned payload at that LSN."""
        self._verified_esn: dict[tuple[LogId, Epoch], int] = {}
        self._acked_unreleased: dict[LogId, list[Lsn]] = {}
        self._release: dict[tuple[str, LogId], Lsn] = {}
        self._nothing_written: dict[bytes, int] = {}
        """Payload -> request id of an append that promised it wrote nothing."""
        self._sent_payloads: set[bytes] = set()
        self.acked: list[ClientAppend] = []
        self.acked_keys: set[Key] = set()
        self.hole_copies: dict[Key, set[NodeId]] = {}
        """Storage nodes whose disk holds a hole (or bridge) recovery wrote at that LSN."""
        self._clean_tails: dict[tuple[LogId, Epoch], Lsn] = {}
        self.releases_count = 0
        self.lost: dict[Key, set[NodeId]] = {}
        """Storage nodes that held a copy at that LSN and lost it to damage (``on_damage``):
        still counted as holders where R copies are required."""
        self._read_views: dict[LogId, tuple[Lsn, list[Segment]]] = {}
        """What the readers of each log saw last (R2): up to which release, which view."""
        self.reads_checked_count = 0
        self._tail_high: dict[LogId, tuple[Lsn, str]] = {}
        self.damage_lost: dict[Key, set[NodeId]] = {}
        """Like ``lost``, for damaged disks only (never rebuilt in the simulation)."""
        self.wiped: dict[NodeId, set[Key]] = {}
        """Per replaced disk not yet rebuilt, the copies it lost (D1)."""
        self.rebuilt_checked_count = 0
        self.regressed: dict[NodeId, dict[Key, tuple[int, int]]] = {}
        """Per node being repaired, where it holds an older copy than the one its damage lost,
        and that one's precedence (D2)."""
        self.precedences: dict[Key, dict[NodeId, tuple[int, int]]] = {}
        """Per LSN, the precedence of the copy (record or hole) each node's disk holds (D2:
        what a rebuild's donors can give)."""
        self._wipes_count = 0
        """Per log, the highest tail reported so far and who reported it (T1)."""

    def _holders(self, key: Key, copies: dict[Key, set[NodeId]]) -> set[NodeId]:
        lost = self.lost.get(key)
        held = copies.get(key, set())
        return held | lost if lost else held

    # ---- C1 -------------------------------------------------------------------------------

    def on_store_sent(self, store: Store) -> None:
        if store.flags & RecordFlags.HOLE:
            return
        for index, payload in enumerate(store_payloads(store)):
            key = (store.log_id, Lsn(store.lsn + index))
            known = self.assigned.setdefault(key, payload)
            if known != payload:
                fail("C1", f"log {key[0]} {format_lsn(key[1])} sent with payload {payload!r} "
                     f"but earlier with {known!r}")
            if payload in self._nothing_written:
                fail("C4", f"payload {payload!r} of request {self._nothing_written[payload]} "
                     "(answered 'nothing written') is in a STORE")
            self._sent_payloads.add(payload)

    def on_disk_write(self, node: NodeId, log_id: LogId, lsn: Lsn, record: DiskRecord,
                      replaced: DiskRecord | None) -> None:
        key = (log_id, lsn)
        precedence = copy_precedence(record.flags, record.wave)
        self.precedences.setdefault(key, {})[node] = precedence
        regressed = self.regressed.get(node)
        if regressed and key in regressed and precedence >= regressed[key]:
            del regressed[key]
        if record.is_hole:
            if key in self.acked_keys:
                fail("C5", f"{node} plugged acknowledged log {log_id} {format_lsn(lsn)} with "
                     f"a hole (flags {record.flags}, seal {record.wave})")
            self.copies.get(key, set()).discard(node)
            self.hole_copies.setdefault(key, set()).add(node)
            return
        self.hole_copies.get(key, set()).discard(node)
        payload = record.payload
        previous = None if replaced is None or replaced.is_hole else replaced.payload
        if previous is not None and previous != payload:
            fail("C1", f"{node} overwrote log {log_id} {format_lsn(lsn)}: {previous!r} "
                 f"-> {payload!r}")
        if self.assigned.get(key) != payload:
            fail("C1", f"{node} wrote {payload!r} at log {log_id} {format_lsn(lsn)}, which was "
                 f"assigned {self.assigned.get(key)!r}")
        self.copies.setdefault(key, set()).add(node)

    # ---- C2 -------------------------------------------------------------------------------

    def on_ack(self, append: ClientAppend, reply: AppendReply) -> None:
        log_id, replication = append.log_id, self._replication_of(append.log_id)
        if reply.last_lsn - reply.first_lsn + 1 != len(append.payloads):
            fail("C2", f"request {append.request_id} acked {format_lsn(reply.first_lsn)}.."
                 f"{format_lsn(reply.last_lsn)} for {len(append.payloads)} payloads")
        for index, payload in enumerate(append.payloads):
            key = (log_id, Lsn(reply.first_lsn + index))
            if self.assigned.get(key) != payload:
                fail("C1", f"request {append.request_id} acked {payload!r} at log {log_id} "
                     f"{format_lsn(key[1])}, which holds {self.assigned.get(key)!r}")
            holders = self._holders(key, self.copies)
            if len(holders) < replication:
                fail("C2", f"request {append.request_id} acked log {log_id} "
                     f"{format_lsn(key[1])} with {len(holders)} copies "
                     f"({sorted(holders)}) < R={replication}")
            heapq.heappush(self._acked_unreleased.setdefault(log_id, []), key[1])
            self.acked_keys.add(key)
            tail = self._clean_tails.get((log_id, lsn_to_epoch(key[1])))
            if tail is not None and key[1] > tail:
                fail("C5", f"request {append.request_id} acked log {log_id} "
                     f"{format_lsn(key[1])} after its epoch was marked clean with tail "
                     f"{format_lsn(tail)}")
        self.acked.append(append)

    # ---- C3 -------------------------------------------------------------------------------

    def on_release(self, holder: str, log_id: LogId, release_lsn: Lsn) -> None:
        previous = self._release.get((holder, log_id), Lsn(0))
        if release_lsn == previous:
            return
        if release_lsn < previous:
            fail("C3", f"{holder} moved log {log_id}'s release back from "
                 f"{format_lsn(previous)} to {format_lsn(release_lsn)}")
        self._release[(holder, log_id)] = release_lsn
        self.releases_count += 1
        where = f"{holder} released log {log_id} up to {format_lsn(release_lsn)}"
        epoch, clean = lsn_to_epoch(release_lsn), self._clean_epoch_of(log_id)
        if epoch > clean + 1:
            fail("C3", f"{where}, but the last clean epoch is {clean}: epochs "
                 f"{clean + 1}..{epoch - 1} are unclean")
        self._check_prefix(where, log_id, release_lsn)
        replication = self._replication_of(log_id)
        acked = self._acked_unreleased.get(log_id, [])
        while acked and acked[0] <= release_lsn:
            lsn = heapq.heappop(acked)
            if len(self._holders((log_id, lsn), self.copies)) < replication:
                fail("C3", f"{where}, but acked {format_lsn(lsn)} is on fewer than "
                     f"R={replication} nodes")

    def _check_prefix(self, where: str, log_id: LogId, release_lsn: Lsn) -> None:
        epoch, replication = lsn_to_epoch(release_lsn), self._replication_of(log_id)
        verified = self._verified_esn.get((log_id, epoch), 0)
        for esn in range(verified + 1, lsn_to_esn(release_lsn) + 1):
            key = (log_id, compose_lsn(epoch, Esn(esn)))
            if len(self._holders(key, self.hole_copies)) >= replication:
                self._verified_esn[(log_id, epoch)] = esn
                continue  # plugged by recovery: a hole, not a record
            if key not in self.assigned:
                fail("C3", f"{where}, but {format_lsn(key[1])} was never written")
            holders = self._holders(key, self.copies)
            if len(holders) < replication:
                fail("C3", f"{where}, but {format_lsn(key[1])} is on {len(holders)} nodes "
                     f"({sorted(holders)}) < R={replication}")
            self._verified_esn[(log_id, epoch)] = esn

    def on_clean_epoch(self, log_id: LogId, epoch: Epoch, tail_lsn: Lsn) -> None:
        """The epoch store accepted ``epoch`` as clean with ``tail_lsn``."""
        # Recovery marks every epoch up to ``epoch`` clean at once.
        previous = max((e for (log, e) in self._clean_tails if log == log_id), default=Epoch(0))
        for cleaned in range(previous + 1, epoch + 1):
            self._clean_tails[(log_id, Epoch(cleaned))] = tail_lsn
        beyond = [lsn for (log, lsn) in self.acked_keys
                  if log == log_id and previous < lsn_to_epoch(lsn) <= epoch and lsn > tail_lsn]
        if beyond:
            fail("C5", f"log {log_id} epochs up to {epoch} marked clean with tail "
                 f"{format_lsn(tail_lsn)}, but {format_lsn(min(beyond))} was acknowledged")
        if lsn_to_epoch(tail_lsn) == epoch:
            self._check_prefix(f"clean tail of epoch {epoch}", log_id, tail_lsn)

    # ---- damage ---------------------------------------------------------------------------

    def on_damage(self, node: NodeId, before: dict[Key, DiskRecord],
                  after: dict[Key, DiskRecord], repaired: bool = False) -> None:
        """``node`` restarted without some of its writes: what it holds is ``after`` now.
        ``repaired``: a mini-rebuild will restore them (D1 checks it, as for a replaced
        disk), so they do not count as copies held by a damaged disk."""
        for key in before.keys() | after.keys():
            was, now = before.get(key), after.get(key)
            if was == now:
                continue
            self.copies.get(key, set()).discard(node)
            self.hole_copies.get(key, set()).discard(node)
            if now is None:
                self.precedences.get(key, {}).pop(node, None)
            else:
                self.precedences.setdefault(key, {})[node] = copy_precedence(now.flags, now.wave)
            if was is not None:
                self.lost.setdefault(key, set()).add(node)
                if repaired:
                    self.wiped.setdefault(node, set()).add(key)
                    lost = copy_precedence(was.flags, was.wave)
                    if now is not None and copy_precedence(now.flags, now.wave) < lost:
                        regressed = self.regressed.setdefault(node, {})
                        regressed[key] = max(regressed.get(key, lost), lost)
                else:
                    self.damage_lost.setdefault(key, set()).add(node)
            if now is not None:
                if now.is_hole:
                    self.hole_copies.setdefault(key, set()).add(node)
                elif self.assigned.get(key) == now.payload:
                    self.copies.setdefault(key, set()).add(node)

    # ---- disk replacement and rebuilding (D1) ---------------------------------------------

    def on_wiped(self, node: NodeId, before: dict[Key, DiskRecord]) -> None:
        """``node``'s disk was replaced: every copy it held is gone until it is rebuilt. (Still
        counted as a holder where C2 and C3 require R copies, as a damaged disk's are.)"""
        for key in before:
            self.copies.get(key, set()).discard(node)
            self.hole_copies.get(key, set()).discard(node)
            self.precedences.get(key, {}).pop(node, None)
            self.lost.setdefault(key, set()).add(node)
        self.wiped.setdefault(node, set()).update(before)
        # The new disk starts with no release pointers: from here on it is another holder
        # (the old one's pointers still count for what readers may have learned).
        holder = f"storage {node}"
        self._wipes_count += 1
        for (who, log_id) in [k for k in self._release if k[0] == holder]:
            self._release[(f"{holder} (disk {self._wipes_count})", log_id)] = (
                self._release.pop((who, log_id)))

    def on_rebuilt(self, node: NodeId) -> None:
        """``node``'s rebuild finished: D1 for the acknowledged copies its old disk held."""
        keys = self.wiped.pop(node, set())
        self.rebuilt_checked_count += 1
        older = self._older_than_donors_give(node, self.regressed.pop(node, {}))
        if older:
            key, precedence = min(older.items())
            fail("D2", f"after {node}'s rebuild: it holds an older copy of log {key[0]} "
                 f"{format_lsn(key[1])} than the one of precedence {precedence} its damage "
                 f"lost and another disk holds ({len(older)} such LSNs)")
        self._check_rereplicated(keys & self.acked_keys, f"after {node}'s rebuild")

    def _older_than_donors_give(self, node: NodeId, regressed: dict[Key, tuple[int, int]],
                                ) -> dict[Key, tuple[int, int]]:
        """Of the LSNs where ``node`` holds an older copy than its damage lost, those where
        another disk holds a copy of higher precedence than ``node``'s (up to the lost one's):
        a rebuild can only restore what some donor still has. Where the lost copy was the
        only one of its precedence (a wave, plug or bridge that reached this node alone),
        nothing can, and the older copy is the best the cluster holds, as for any node the
        later wave did not reach."""
        older: dict[Key, tuple[int, int]] = {}
        for key, lost in regressed.items():
            held = self.precedences.get(key, {})
            mine = held.get(node)
            if mine is None:
                continue
            given = max((p for n, p in held.items() if n != node), default=None)
            if given is not None and mine < min(lost, given):
                older[key] = min(lost, given)
        return older

    def _check_rereplicated(self, keys: Iterable[Key], when: str) -> None:
        # A copy another disk lost and that disk's rebuild (a mini-rebuild of its damage)
        # has yet to restore counts as held here: it is checked when that rebuild finishes.
        pending: dict[Key, set[NodeId]] = {}
        for node, lost_keys in self.wiped.items():
            for key in lost_keys:
                pending.setdefault(key, set()).add(node)
        for key in sorted(keys):
            log_id, lsn = key
            held = (self.copies.get(key, set()) | self.damage_lost.get(key, set())
                    | pending.get(key, set()))
            replication = self._replication_of(log_id)
            if len(held) < replication:
                fail("D1", f"{when}: acknowledged log {log_id} {format_lsn(lsn)} is on "
                     f"{sorted(self.copies.get(key, set()))} (damaged: "
                     f"{sorted(self.damage_lost.get(key, set()))}) < R={replication}")

    def check_rereplicated_all(self) -> None:
        """D1 at the end: every rebuild finished; every acknowledged record is on R disks."""
        assert not self.wiped, f"rebuilds not finished: {sorted(self.wiped)}"
        self._check_rereplicated(self.acked_keys, "at the end")

    # ---- R2 and T1, every reader_check_interval_ms ---------------------------------------

    def release_high(self, log_id: LogId) -> Lsn:
        """The highest release pointer of ``log_id`` anyone (sequencer or storage node) ever
        held: what some reader may have learned."""
        return max((lsn for (_, log), lsn in self._release.items() if log == log_id),
                   default=Lsn(0))

    def check_readers_now(self, log_id: LogId, nodes: dict[NodeId, SimStorageNode],
                          nodeset: tuple[NodeId, ...], replication: int,
                          subsets: list[tuple[NodeId, ...]]) -> None:
        """R2 over ``subsets`` (f-majorities of ``nodeset``)."""
        release_lsn = self.release_high(log_id)
        if release_lsn == 0:
            return
        self.reads_checked_count += 1
        acked = [(Lsn(a.first_lsn + i), payload) for a in self.acked if a.log_id == log_id
                 for i, payload in enumerate(a.payloads) if a.first_lsn + i <= release_lsn]
        first: tuple[tuple[NodeId, ...], list[Segment]] | None = None
        for members in subsets:
            view = segments(_read_like_a_reader(log_id, nodes, members, nodeset,
                                                f_majority(len(nodeset), replication),
                                                release_lsn))
            where = (f"reading log {log_id} through {members} up to "
                     f"{format_lsn(release_lsn)}")
            records = {lsn: payload for kind, lsn, _, payload in view if kind == "R"}
            for lsn, payload in acked:
                if records.get(lsn) != payload:
                    fail("R2", f"{where}: acknowledged {format_lsn(lsn)} reads as "
                         f"{describe_at(view, lsn)}, not {payload!r}")
            if first is None:
                first = (members, view)
            elif view != first[1]:
                fail("R2", f"{where} disagrees with reading through {first[0]}: "
                     f"{first_difference(view, first[1])}")
        assert first is not None
        previous = self._read_views.get(log_id)
        if previous is not None:
            old_release, old_view = previous
            now = cut(first[1], old_release)
            if now != old_view:
                fail("R2", f"log {log_id}: reading up to {format_lsn(old_release)} through "
                     f"{first[0]} now differs from an earlier read: "
                     f"{first_difference(now, old_view)}")
        self._read_views[log_id] = (release_lsn, first[1])

    def tail_high(self, log_id: LogId) -> tuple[Lsn, str]:
        """The highest tail of ``log_id`` any frontend reported so far, and who did."""
        return self._tail_high.get(log_id, (Lsn(0), ""))

    def on_tail(self, frontend: str, log_id: LogId, tail_lsn: Lsn,
                floor: tuple[Lsn, str] | None = None) -> None:
        """T1: ``frontend`` reports ``tail_lsn`` as the log's tail, in answer to a request
        that started when ``floor`` (``tail_high``) was the highest tail reported (default:
        now, for a request answered at once)."""
        high, who = floor if floor is not None else self.tail_high(log_id)
        if tail_lsn < high:
            fail("T1", f"{frontend} reports log {log_id}'s tail as {format_lsn(tail_lsn)}, "
                 f"but {who} reported {format_lsn(high)} before the request")
        if tail_lsn > self.tail_high(log_id)[0]:
            self._tail_high[log_id] = (tail_lsn, frontend)

    # ---- C4 -------------------------------------------------------------------------------

    def on_nothing_written(self, append: ClientAppend) -> None:
        for payload in append.payloads:
            if payload in self._sent_payloads:
                fail("C4", f"request {append.request_id} was answered "
                     f"{append.core_reply.status.name if append.core_reply else 'refused'} "
                     f"(nothing written) but {payload!r} was sent in a STORE")
            self._nothing_written[payload] = append.request_id

    # ---- at the end -----------------------------------------------------------------------

    def check_final(self, storage_nodes: Iterable[SimStorageNode]) -> None:
        nodes = list(storage_nodes)
        on_disk: dict[bytes, list[str]] = {}
        for node in nodes:
            for (log_id, lsn), record in node.disk.records.items():
                if not record.is_hole and record.payload in self._nothing_written:
                    on_disk.setdefault(record.payload, []).append(
                        f"{node.node_id}:{log_id}:{format_lsn(lsn)}")
        for payload, where in on_disk.items():
            fail("C4", f"payload {payload!r} of request {self._nothing_written[payload]} "
                 f"(answered 'nothing written') is on disk at {where}")
        for append in self.acked:
            replication = self._replication_of(append.log_id)
            for index, payload in enumerate(append.payloads):
                lsn = Lsn(append.first_lsn + index)
                holders = {n.node_id for n in nodes
                           if (r := n.disk.records.get((append.log_id, lsn))) is not None
                           and not r.is_hole and r.payload == payload}
                declared = {n.node_id for n in nodes if n.node_id not in holders
                            and n.disk.authority.ranges(append.log_id, lsn, lsn)}
                lost = self.lost.get((append.log_id, lsn), set())
                if len(holders | declared | lost) < replication:
                    fail("C2", f"acked log {append.log_id} {format_lsn(lsn)} is on "
                         f"{holders} at the end < R={replication}")

    def check_readers_agree(self, log_id: LogId, nodes: dict[NodeId, SimStorageNode],
                            nodeset: tuple[NodeId, ...], replication: int,
                            release_lsn: Lsn) -> None:
        """R1: every f-majority of the nodeset gives the same view of ``[1, release_lsn]``,
        with every acknowledged record in it."""
        if release_lsn == 0:
            return
        views: dict[tuple[NodeId, ...], View] = {}
        size = f_majority(len(nodeset), replication)
        for members in itertools.combinations(sorted(nodeset), size):
            view = _read_like_a_reader(log_id, nodes, members, nodeset, size, release_lsn)
            views[members] = view
            records = dict(view[0])
            for append in self.acked:
                if append.log_id != log_id:
                    continue
                for index, payload in enumerate(append.payloads):
                    lsn = append.first_lsn + index
                    if lsn <= release_lsn and records.get(lsn) != payload:
                        gaps = [(k, format_lsn(Lsn(lo)), format_lsn(Lsn(hi)))
                                for k, lo, hi in view[1]][:6]
                        fail("R1", f"reading log {log_id} from {members} up to "
                             f"{format_lsn(release_lsn)}: acknowledged {format_lsn(Lsn(lsn))} "
                             f"reads as {records.get(lsn)!r}, not {payload!r}; gaps {gaps}")
        first_members, first_view = next(iter(views.items()))
        for members, view in views.items():
            if view != first_view:
                detail = f"{first_view!r} vs {view!r}"[:2000]
                fail("R1", f"log {log_id}: readers through {first_members} and {members} "
                     f"disagree: {detail}")


View = tuple[list[tuple[int, bytes]], list[tuple[str, int, int]]]


def _read_like_a_reader(log_id: LogId, nodes: dict[NodeId, SimStorageNode],
                        members: tuple[NodeId, ...], nodeset: tuple[NodeId, ...],
                        needed: int, release_lsn: Lsn) -> View:
    """Records and gaps of ``[1, release_lsn]`` as a reader gets them starting from
    ``members``: merged from where it is, with one more node of the nodeset whenever too
    few of those it has vouch for the next LSN (all of them: merged whatever they say)."""
    asked = list(members)
    records: list[tuple[int, bytes]] = []
    gaps: list[tuple[str, int, int]] = []
    cursor = Lsn(1)
    while cursor <= release_lsn:
        answers = [disk_answer(nodes[m], log_id, release_lsn) for m in asked]
        merged = merge(answers, cursor, release_lsn, 10**9, 2**62,
                       0 if len(asked) == len(nodeset) else needed)
        records += [(r[0], r[3]) for r in merged.records]
        for gap in merged.gaps:
            if gaps and gaps[-1][0] == gap.kind and gaps[-1][2] + 1 == gap.lo:
                gaps[-1] = (gap.kind, gaps[-1][1], gap.hi)
            else:
                gaps.append((gap.kind, gap.lo, gap.hi))
        if merged.next_lsn <= cursor:
            asked.append(next(n for n in sorted(nodeset) if n not in asked))
        cursor = merged.next_lsn
    return records, gaps


Segment = tuple[str, int, int, bytes | None]
"""(kind, lo, hi, payload): "R" a record (lo == hi), "GAP" a hole or bridge (recovery's "no
record"; where a bridge ends an epoch is a detail), else the gap kind (DATALOSS, TRIM)."""


def segments(view: View) -> list[Segment]:
    """A read as one list of segments in LSN order, adjacent no-record gaps joined."""
    records, gaps = view
    items: list[Segment] = [("R", lsn, lsn, payload) for lsn, payload in records]
    items += [("GAP" if kind in ("HOLE", "BRIDGE") else kind, lo, hi, None)
              for kind, lo, hi in gaps]
    items.sort(key=lambda item: item[1])
    joined: list[Segment] = []
    for item in items:
        if joined and item[0] != "R" and joined[-1][0] == item[0] and (
                joined[-1][2] + 1 == item[1]):
            joined[-1] = (item[0], joined[-1][1], item[2], None)
        else:
            joined.append(item)
    return joined


def cut(view: list[Segment], last_lsn: Lsn) -> list[Segment]:
    """``view`` up to ``last_lsn``."""
    return [(kind, lo, min(hi, last_lsn), payload) for kind, lo, hi, payload in view
            if lo <= last_lsn]


def describe_at(view: list[Segment], lsn: Lsn) -> str:
    for kind, lo, hi, payload in view:
        if lo <= lsn <= hi:
            return repr(payload) if kind == "R" else f"{kind} {format_lsn(Lsn(lo))}.." \
                f"{format_lsn(Lsn(hi))}"
    return "nothing"


def first_difference(a: list[Segment], b: list[Segment]) -> str:
    """Where view ``a`` first differs from view ``b``: "a's segment, not b's"."""
    for x, y in itertools.zip_longest(a, b):
        if x != y:
            return f"{describe_segment(x)}, not {describe_segment(y)}"
    return "none"


def describe_segment(segment: Segment | None) -> str:
    if segment is None:
        return "(end)"
    kind, lo, hi, payload = segment
    if kind == "R":
        return f"record {payload!r} at {format_lsn(Lsn(lo))}"
    return f"{kind} {format_lsn(Lsn(lo))}..{format_lsn(Lsn(hi))}"


def disk_answer(node: SimStorageNode, log_id: LogId, release_lsn: Lsn) -> NodeAnswer:
    """What ``node`` answers a READ of ``log_id`` up to ``release_lsn``, from its disk."""
    records = []
    markers = []
    for (log, lsn), record in sorted(node.disk.records.items()):
        if log != log_id or lsn > release_lsn:
            continue
        if record.flags:
            markers.append((lsn, lsn, record.flags, record.wave))
        if not record.is_hole:
            records.append((lsn, record.timestamp_ms, None, record.payload))
    return NodeAnswer(records=tuple(records), next_lsn=Lsn(release_lsn + 1),
                      release_lsn=release_lsn, markers=tuple(markers),
                      non_authoritative=node.disk.authority.ranges(log_id, 1, release_lsn))

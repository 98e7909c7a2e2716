"""The binary client protocol (docs/PROTOCOL.md) on real node processes: ``seqlog.Client``
appends over it across both sequencer nodes; a node that does not own a log forwards a client's
APPEND, or with ``no_forward`` names the owner's data address and writes nothing; and a fuzz
run of hostile input on a node's data port (truncated frames, wrong types, huge lengths,
unknown message types, node-only messages, forged hops) gets clear answers or a closed
connection, with the node serving appends after every case."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from seqlog_cluster_support import RunningCluster

from seqlog import Client
from seqlog.binary import Connections
from shared.routing import sequencer_for
from shared.status import Status
from shared.types import LogId, Lsn, NodeId
from shared.wire.append import Append, Appended
from shared.wire.codec import Message
from tests.unit.net.hostile_frames import append_works, check_case, hostile

pytestmark = pytest.mark.integration

ANSWER_TIMEOUT_S = 5.0


async def _cluster_view(urls: list[str]) -> tuple[str, dict[str, str], list[str]]:
    """(fingerprint, data address by node id, sequencer node ids) from GET /v1/cluster."""
    async with Client(urls, protocol="http") as client:
        info = await client.cluster()
    data = {n.node_id: n.data for n in info.nodes}
    sequencers = [n.node_id for n in info.nodes if "sequencer" in n.roles]
    assert info.cluster_fingerprint and all(data.values())
    return info.cluster_fingerprint, data, sequencers


async def _request(connections: Connections, address: str, message: Append) -> Message | Status:
    conn = await connections.get(address)
    answer: asyncio.Future[Message | Status] = asyncio.get_running_loop().create_future()
    conn.request(message, answer.set_result)
    async with asyncio.timeout(ANSWER_TIMEOUT_S):
        return await answer


async def test_client_appends_over_the_binary_protocol_across_nodes(
        local_cluster: RunningCluster) -> None:
    logs = range(2001, 2013)
    async with Client(local_cluster.sequencer_urls) as client:
        singles = {log: [await client.append(log, b"%d-%d" % (log, i)) for i in range(3)]
                   for log in logs}
        batches = {log: await client.append_batch(log, [b"b%d" % i for i in range(4)],
                                                  key="k") for log in logs}
        futures = [client.append_future(log, b"f%d" % log) for log in logs]
        tails = [(await f).lsn for f in futures]
        assert client.protocol == "binary"
        owners = set()
        for log, tail in zip(logs, tails, strict=True):
            lsns = [r.lsn for r in singles[log]]
            batch = batches[log]
            assert lsns == sorted(lsns) and batch.first_lsn > lsns[-1] and batch.count == 4
            assert batch.last_lsn == batch.first_lsn + 3 and tail == batch.last_lsn + 1
            result = await client.read(log, lsns[0], wait_ms=2_000)
            assert [r.payload for r in result.records] == [
                *(b"%d-%d" % (log, i) for i in range(3)), *(b"b%d" % i for i in range(4)),
                b"f%d" % log]
            owners.add((await client.tail(log)).sequencer)
    assert len(owners) == 2, owners  # both sequencer nodes took binary appends


async def test_single_appends_made_together_share_frames_and_each_gets_its_own_lsn(
        local_cluster: RunningCluster) -> None:
    log = 2901
    count = 600
    async with Client(local_cluster.sequencer_urls) as client:
        first = (await client.append(log, b"first")).lsn  # connects, learns the owner
        binary = client._binary
        assert binary is not None
        frames_before = binary.connections.counters.frames_sent
        futures = [client.append_future(log, b"g%d" % i) for i in range(count)]
        results = await asyncio.gather(*futures)
        # The first alone (the connection was idle), then grouped (at most 512 per entry of
        # one APPEND_MULTI, protocol version 3): two frames, not 600.
        assert binary.connections.counters.frames_sent - frames_before == 2
        lsns = [r.lsn for r in results]
        assert lsns == list(range(first + 1, first + 1 + count))
        records = []
        while len(records) < count:
            result = await client.read(log, Lsn(first + 1 + len(records)), wait_ms=2_000)
            records.extend(result.records)
        assert [(r.lsn, r.payload) for r in records] == [
            (lsn, b"g%d" % i) for i, lsn in enumerate(lsns)]


async def test_a_non_owner_forwards_or_redirects_to_the_owners_data_address(
        local_cluster: RunningCluster) -> None:
    fingerprint, data, sequencers = await _cluster_view(local_cluster.sequencer_urls)
    connections = Connections(cluster_fingerprint=fingerprint, connect_timeout_ms=2_000,
                              timeout_ms=10_000)
    try:
        log = LogId(2101)
        owner = sequencer_for(log, [(NodeId(n), 1.0) for n in sequencers])
        assert owner is not None
        other = next(n for n in sequencers if n != owner)
        redirect = await _request(connections, data[other], Append(
            log_id=log, payloads=(b"r",), key=None, hops=0, no_forward=True))
        assert isinstance(redirect, Appended), redirect
        assert (redirect.status, redirect.sequencer_node, redirect.redirect_data) == (
            Status.NOSEQUENCER, owner, data[owner])
        first = await _request(connections, data[owner], Append(
            log_id=log, payloads=(b"first",), key=None, hops=0, no_forward=True))
        assert isinstance(first, Appended) and first.status is Status.OK
        assert first.first_lsn & 0xFFFFFFFF == 1  # the redirect wrote nothing
        forwarded = await _request(connections, data[other], Append(
            log_id=log, payloads=(b"fwd",), key=None, hops=0))
        assert isinstance(forwarded, Appended) and forwarded.status is Status.OK
        assert forwarded.sequencer_node == owner and forwarded.first_lsn == first.first_lsn + 1
    finally:
        await connections.close()


# ---- fuzzing a node's data port ----------------------------------------------------------

def test_hostile_input_on_the_data_port_gets_clear_errors_and_the_node_stays_healthy(
        local_cluster: RunningCluster) -> None:
    fingerprint, data, sequencers = asyncio.run(_cluster_view(local_cluster.sequencer_urls))
    port = int(data[sequencers[0]].rpartition(":")[2])
    append_works(port, fingerprint)  # activates the log before the fuzzing starts

    @settings(max_examples=120, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(hostile())
    def check(case: tuple[str, bytes]) -> None:
        check_case(port, fingerprint, case)
        append_works(port, fingerprint)

    check()

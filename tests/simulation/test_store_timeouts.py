"""Store timeouts under slow disks: each copy is written once (issue 15 item 5).

Disks slower than the first store timeout used to get every wave's payload again, written
again: the sequencer now waits for a node still working on the previous wave's STORE, learns
per node how long STOREs take, and a storage node answers a copy of a STORE it is still
writing with that one write.
"""

from __future__ import annotations

from collections import Counter

import pytest

from shared.status import Status
from shared.types import LogId, Lsn, NodeId
from tests.simulation.runner import heal_and_check
from tests.simulation.sim_cluster import SimCluster
from tests.simulation.sim_storage import DiskRecord, DiskWriteHook
from tests.simulation.test_scenarios import LOG, make_cluster, report, wait


def _writes_counted(cluster: SimCluster) -> Counter[tuple[NodeId, LogId, Lsn]]:
    """Sequencer copies written to the nodes' disks, per (node, log, LSN)."""
    writes: Counter[tuple[NodeId, LogId, Lsn]] = Counter()
    for node in cluster.storage.values():
        hook = node._on_disk_write

        def counted(node_id: NodeId, log_id: LogId, lsn: Lsn, record: DiskRecord,
                    previous: DiskRecord | None, hook: DiskWriteHook = hook) -> None:
            if not record.flags:
                writes[(node_id, log_id, lsn)] += 1
            hook(node_id, log_id, lsn, record, previous)

        node._on_disk_write = counted
    return writes


def _slow_disk_run(seed: int, request: pytest.FixtureRequest) -> int:
    """Appends over disks slower than the first store timeout; the STOREs joined."""
    # Disk writes take up to 150 ms; the first store timeout starts at 10 ms.
    cluster = make_cluster(seed, storage_nodes_count=3, replication=3, disk_delay_ms_max=150,
                           store_timeout_ms_min=10, delay_ms_min=1, delay_ms_max=2,
                           client_delay_ms_max=0, partition_connfail_ratio=0.0)
    writes = _writes_counted(cluster)
    with report(cluster, request):
        appends = []
        for burst in range(10):
            appends += [cluster.append(LOG, (f"slow:{burst}:{i}".encode(),)) for i in range(3)]
            cluster.run_for(40)
        wait(cluster, lambda: all(a.outcome is not None for a in appends), "answers")
        assert all(a.outcome == Status.OK for a in appends)
        # Each copy once, but for a reply still on its way when the timeout fires.
        ratio = sum(writes.values()) / len(writes)
        assert ratio <= 1.1, f"seed {seed}: {ratio:.2f} writes per copy"
        heal_and_check(cluster)
    return sum(node.stores_joined_count for node in cluster.storage.values())


def test_slow_disks_write_each_copy_once(request: pytest.FixtureRequest) -> None:
    joined = sum(_slow_disk_run(seed, request) for seed in range(1, 6))
    # Waves that went out again while a node was still writing were answered by that write.
    assert joined > 0

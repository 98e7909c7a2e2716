"""Which configuration changes a running node may reload (added nodes, weights) and which it
must refuse (removed or moved nodes, cluster-wide settings), and that listeners hear of it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from services.membership import ClusterChange, Membership, MembershipError, cluster_change
from shared.config import ClusterConfig, NodeConfig, ProcessConfig, to_dict
from shared.types import NodeId


def node(node_id: str, role: str = "storage", port: int = 9000, **kw: float) -> NodeConfig:
    return NodeConfig(node_id=NodeId(node_id), roles=(role,),  # type: ignore[arg-type]
                      http_port=port, data_port=port + 1, **kw)


BASE = ClusterConfig(cluster_name="c", nodes=(node("seq1", "sequencer", 9000),
                                              node("st1", port=9002), node("st2", port=9004)),
                     replication_factor=2)


def test_fingerprint_ignores_the_node_list_but_not_settings() -> None:
    grown = replace(BASE, nodes=(*BASE.nodes, node("st3", port=9006)))
    assert grown.fingerprint() == BASE.fingerprint()
    assert replace(BASE, replication_factor=1).fingerprint() != BASE.fingerprint()
    assert replace(BASE, cluster_name="other").fingerprint() != BASE.fingerprint()


def test_additions_and_weights_are_a_reloadable_change() -> None:
    st3, seq2 = node("st3", port=9006), node("seq2", "sequencer", 9008)
    new = replace(BASE, nodes=(BASE.nodes[0], replace(BASE.nodes[1], storage_capacity=2.0),
                               BASE.nodes[2], st3, seq2))
    change = cluster_change(BASE, new)
    assert change.added == (st3, seq2)
    assert [n.node_id for n in change.reweighted] == ["st1"]
    assert cluster_change(BASE, BASE) == ClusterChange(added=(), reweighted=())


@pytest.mark.parametrize(("new", "reason"), [
    (replace(BASE, nodes=(BASE.nodes[0], BASE.nodes[2], node("st3", port=9006))),
     "removing nodes"),
    (replace(BASE, nodes=(BASE.nodes[0], BASE.nodes[1], node("st2", port=9100))), "moved"),
    (replace(BASE, nodes=(BASE.nodes[0], BASE.nodes[1], node("st2", "sequencer", 9004),
                          node("st3", port=9006))), "moved"),
    (replace(BASE, replication_factor=1), "cluster-wide settings"),
])
def test_other_changes_are_refused(new: ClusterConfig, reason: str) -> None:
    with pytest.raises(MembershipError, match=reason):
        cluster_change(BASE, new)


def test_reload_applies_a_file_and_keeps_the_old_config_on_a_bad_one(tmp_path: Path) -> None:
    config = ProcessConfig(node_id=NodeId("st1"), cluster=BASE, data_dir=str(tmp_path))
    membership = Membership(config)
    heard: list[tuple[ClusterConfig, ClusterChange]] = []
    membership.subscribe(lambda cluster, change: heard.append((cluster, change)))
    path = tmp_path / "config.json"
    grown = replace(BASE, nodes=(*BASE.nodes, node("st3", port=9006)))
    path.write_text(json.dumps(to_dict(replace(config, cluster=grown))))
    change = membership.reload(str(path))
    assert change is not None and [n.node_id for n in change.added] == ["st3"]
    assert membership.cluster == grown and heard == [(grown, change)]
    for bad in ("{not json", json.dumps(to_dict(replace(config, cluster=BASE)))):
        path.write_text(bad)
        assert membership.reload(str(path)) is None
        assert membership.cluster == grown and len(heard) == 1
    other = replace(config, node_id=NodeId("st2"), cluster=grown)
    path.write_text(json.dumps(to_dict(other)))
    assert membership.reload(str(path)) is None

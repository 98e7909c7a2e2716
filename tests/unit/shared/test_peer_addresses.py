"""``transport.peer_addresses``: validated, carried through the JSON config, per node in the
local-cluster plan, and outside the cluster fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services import local_cluster as lc
from shared.config import ProcessConfig, TransportConfig, process_from_dict, to_dict


def test_overrides_parse_and_default_to_none() -> None:
    config = TransportConfig(peer_addresses={"st1": "127.0.0.2:9001", "seq-2": "[::1]:80"})
    assert config.peer_address("st1") == ("127.0.0.2", 9001)
    assert config.peer_address("seq-2") == ("[::1]", 80)
    assert config.peer_address("st2") is None
    assert TransportConfig().peer_addresses == {}


@pytest.mark.parametrize(("addresses", "complaint"), [
    ({"st1": "127.0.0.1"}, "not 'host:port'"),
    ({"st1": ":9000"}, "not 'host:port'"),
    ({"st1": "127.0.0.1:http"}, "not 'host:port'"),
    ({"st1": "127.0.0.1:70000"}, "outside"),
    ({"st1": 9000}, "not a 'host:port' string"),
    ({"bad id!": "127.0.0.1:9000"}, "bad node id"),
])
def test_bad_overrides_are_rejected(addresses: dict[str, object], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        TransportConfig(peer_addresses=addresses)  # type: ignore[arg-type]


def _configs(tmp_path: Path, peer_addresses: dict[str, dict[str, str]]) -> list[ProcessConfig]:
    return lc.plan(lc.LocalClusterSpec(dir=tmp_path, base_port=9000,
                                       peer_addresses=peer_addresses))


def test_plan_gives_each_node_its_own_overrides_outside_the_fingerprint(
        tmp_path: Path) -> None:
    plain = _configs(tmp_path, {})
    routed = _configs(tmp_path, {"seq1": {"st1": "127.0.0.1:20001"},
                                 "st2": {"seq1": "127.0.0.1:20002"}})
    by_id: dict[str, ProcessConfig] = {c.node_id: c for c in routed}
    assert by_id["seq1"].transport.peer_address("st1") == ("127.0.0.1", 20001)
    assert by_id["st2"].transport.peer_addresses == {"seq1": "127.0.0.1:20002"}
    assert by_id["st1"].transport.peer_addresses == {}
    # Every node keeps the same cluster config, so they still accept each other.
    assert {c.cluster.fingerprint() for c in plain + routed} == {
        plain[0].cluster.fingerprint()}
    for config in routed:
        assert process_from_dict(json.loads(json.dumps(to_dict(config)))) == config


def test_overrides_must_name_cluster_nodes(tmp_path: Path) -> None:
    with pytest.raises(lc.LocalClusterError, match=r"not in the cluster: \['st9'\]"):
        _configs(tmp_path, {"seq1": {"st9": "127.0.0.1:20001"}})

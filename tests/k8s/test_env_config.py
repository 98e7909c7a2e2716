"""``services.env_config``: a node's configuration from SEQLOG_* variables, and the node
runner's ``--from-env`` mode, including clear errors for bad environments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from k8s_support import REPO_ROOT

from services.env_config import (
    EnvConfigError,
    config_from_env,
    parse_connect_to,
    rewrite_zk_url,
)

DOMAIN = "seqlog-nodes.ns.svc.cluster.local"


def _env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"cluster": {"cluster_name": "t", "replication_factor": 2},
                                    "gossip": {"suspect_duration_ms": 500}}))
    env = {
        "SEQLOG_NODE_ID": "seqlog-storage-1",
        "SEQLOG_DATA_DIR": str(tmp_path / "data"),
        "SEQLOG_SEQUENCER_SET": "seqlog-sequencer",
        "SEQLOG_SEQUENCER_REPLICAS": "2",
        "SEQLOG_STORAGE_SET": "seqlog-storage",
        "SEQLOG_STORAGE_REPLICAS": "3",
        "SEQLOG_PEER_DOMAIN": DOMAIN,
        "SEQLOG_EPOCH_STORE": "zk://zk-client:2181/seqlog",
        "SEQLOG_SETTINGS_FILE": str(settings),
        "SEQLOG_LISTEN_HOST": "0.0.0.0",
    }
    env.update(overrides)
    return {k: v for k, v in env.items() if v != "<unset>"}


def test_a_pod_environment_gives_the_whole_static_cluster(tmp_path: Path) -> None:
    node = config_from_env(_env(tmp_path))
    config = node.config
    assert config.node_id == "seqlog-storage-1"
    assert config.me.roles == ("storage",)
    assert config.me.host == f"seqlog-storage-1.{DOMAIN}"
    assert (config.me.http_port, config.me.data_port) == (7400, 7401)
    assert [n.node_id for n in config.cluster.nodes] == [
        "seqlog-sequencer-0", "seqlog-sequencer-1",
        "seqlog-storage-0", "seqlog-storage-1", "seqlog-storage-2"]
    assert [n.roles for n in config.cluster.sequencer_nodes] == [("sequencer",)] * 2
    assert config.cluster.replication_factor == 2
    assert config.gossip.suspect_duration_ms == 500
    assert config.epoch_store == "zk://zk-client:2181/seqlog"
    assert config.transport.peer_addresses == {}
    assert node.listen_host == "0.0.0.0"
    assert node.shutdown_timeout_ms == 20_000
    other = config_from_env(_env(tmp_path, SEQLOG_NODE_ID="seqlog-sequencer-0"))
    assert other.config.cluster.fingerprint() == config.cluster.fingerprint()
    assert other.config.me.roles == ("sequencer",)


def test_connect_to_redirects_peers_and_zookeeper(tmp_path: Path) -> None:
    connect_to = (f"seqlog-storage-0.{DOMAIN}:7401=127.0.9.3:7401,"
                  "zk-client:2181=127.0.9.7:2181|127.0.9.8:2181")
    config = config_from_env(_env(tmp_path, SEQLOG_CONNECT_TO=connect_to)).config
    assert config.transport.peer_addresses == {"seqlog-storage-0": "127.0.9.3:7401"}
    assert config.epoch_store == "zk://127.0.9.7:2181,127.0.9.8:2181/seqlog"
    # The cluster itself (and so its fingerprint) does not change.
    plain = config_from_env(_env(tmp_path)).config
    assert config.cluster.fingerprint() == plain.cluster.fingerprint()


def test_helpers_parse_and_rewrite() -> None:
    assert parse_connect_to(" a:1=127.0.0.2:1 , b:2=127.0.0.3:3|127.0.0.4:3,") == {
        "a:1": ["127.0.0.2:1"], "b:2": ["127.0.0.3:3", "127.0.0.4:3"]}
    assert rewrite_zk_url("zk://a:1,c:2/r?session_timeout_ms=3000",
                          {"a:1": ["x:5", "y:6"]}) == "zk://x:5,y:6,c:2/r?session_timeout_ms=3000"
    for bad in ("a:1", "a=b:1", "a:1=", "a:x=b:1", "a:1=b:70000"):
        with pytest.raises(EnvConfigError):
            parse_connect_to(bad)
    for bad in ("zk://a:1", "zk:///r", "http://a:1/r", "zk://a/r"):
        with pytest.raises(EnvConfigError):
            rewrite_zk_url(bad, {})


@pytest.mark.parametrize(("overrides", "message"), [
    ({"SEQLOG_NODE_ID": "<unset>"}, "SEQLOG_NODE_ID is not set"),
    ({"SEQLOG_NODE_ID": "bad id!"}, "not a valid node id"),
    ({"SEQLOG_NODE_ID": "seqlog-storage-3"}, "is not one of the configured nodes"),
    ({"SEQLOG_STORAGE_REPLICAS": "0"}, "SEQLOG_STORAGE_REPLICAS='0' is not an integer in"),
    ({"SEQLOG_STORAGE_REPLICAS": "three"}, "SEQLOG_STORAGE_REPLICAS='three'"),
    ({"SEQLOG_SEQUENCER_SET": "<unset>"}, "SEQLOG_SEQUENCER_SET is not set"),
    ({"SEQLOG_SEQUENCER_SET": "seqlog-storage"}, "give the same node names"),
    ({"SEQLOG_HTTP_PORT": "7401"}, "must differ"),
    ({"SEQLOG_DATA_PORT": "70000"}, "SEQLOG_DATA_PORT='70000'"),
    ({"SEQLOG_DATA_DIR": "<unset>"}, "SEQLOG_DATA_DIR is not set"),
    ({"SEQLOG_EPOCH_STORE": "file"}, "needs SEQLOG_EPOCH_STORE_DIR"),
    ({"SEQLOG_EPOCH_STORE": "zk://x"}, "needs hosts and a root path"),
    ({"SEQLOG_SETTINGS_FILE": "/nonexistent/settings.json"}, "No such file"),
    ({"SEQLOG_SHUTDOWN_TIMEOUT_MS": "10"}, "SEQLOG_SHUTDOWN_TIMEOUT_MS='10'"),
    ({"SEQLOG_CONNECT_TO": "nonsense"}, "SEQLOG_CONNECT_TO entry"),
])
def test_bad_environments_are_named(tmp_path: Path, overrides: dict[str, str],
                                    message: str) -> None:
    with pytest.raises(EnvConfigError, match=None) as caught:
        config_from_env(_env(tmp_path, **overrides))
    assert message in str(caught.value)


@pytest.mark.parametrize(("settings", "message"), [
    ("[1]", "must hold a JSON object"),
    ("{", "is not JSON"),
    ('{"node_id": "x"}', "node-specific settings come from the environment"),
    ('{"cluster": {"nodes": []}}', "cluster.nodes is derived"),
    ('{"storage": 5}', "storage must be an object"),
    ('{"storage": {"fsync": "sometimes"}}', "invalid node configuration: fsync must be"),
    ('{"cluster": {"replication_factor": 4}}', "exceeds the 3 storage nodes"),
    ('{"gossip": {"no_such_setting": 1}}', "unknown settings ['no_such_setting']"),
])
def test_bad_settings_files_are_named(tmp_path: Path, settings: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(settings)
    with pytest.raises(EnvConfigError) as caught:
        config_from_env(_env(tmp_path, SEQLOG_SETTINGS_FILE=str(path)))
    assert message in str(caught.value)


def test_the_node_runner_rejects_a_bad_environment_with_a_clear_message(tmp_path: Path) -> None:
    env = {**_env(tmp_path, SEQLOG_NODE_ID="seqlog-storage-7"), "PATH": os.environ["PATH"],
           "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-m", "services.node", "--from-env"], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "bad environment: SEQLOG_NODE_ID='seqlog-storage-7' is not one of" in result.stderr
    assert "Traceback" not in result.stderr

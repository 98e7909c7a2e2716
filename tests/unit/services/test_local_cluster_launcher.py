"""The local-cluster launcher and the ``seqlog`` CLI, with a stand-in node process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqlog import Gap, Record
from services import cli
from services import local_cluster as lc
from shared.config import process_from_dict, to_dict
from shared.types import Lsn

HERE = Path(__file__).resolve().parent


def processes_mentioning(root: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(root).encode() in cmdline:
            found.append(int(proc.name))
    return found


@pytest.fixture
def fake_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lc, "NODE_MODULE", "fake_node_process")
    monkeypatch.setenv("PYTHONPATH", str(HERE))


def spec(tmp_path: Path, **kwargs: object) -> lc.LocalClusterSpec:
    base = lc.free_base_port(5)
    return lc.LocalClusterSpec(dir=tmp_path / "c", base_port=base, **kwargs)  # type: ignore[arg-type]


def test_plan_names_ports_and_paths(tmp_path: Path) -> None:
    s = lc.LocalClusterSpec(dir=tmp_path, base_port=9000, fsync="never", sequencers=2)
    configs = lc.plan(s)
    assert [c.node_id for c in configs] == ["seq1", "seq2", "st1", "st2", "st3"]
    assert [c.me.http_port for c in configs] == [9000, 9002, 9004, 9006, 9008]
    assert [c.me.data_port for c in configs] == [9001, 9003, 9005, 9007, 9009]
    assert configs[0].me.roles == ("sequencer",) and configs[2].me.roles == ("storage",)
    for c in configs:
        assert c.data_dir == str(tmp_path.resolve() / c.node_id)
        assert c.epoch_store == "file" and c.epoch_store_dir == str(tmp_path.resolve() / "epochs")
        assert c.storage.fsync == "never" and c.cluster.replication_factor == 3
        assert process_from_dict(json.loads(json.dumps(to_dict(c)))) == c
    assert lc.epoch_store_url(s) == f"file://{tmp_path.resolve() / 'epochs'}"


@pytest.mark.parametrize(
    "kwargs", [{"replication": 4}, {"base_port": 65530}, {"sequencers": 0}]
)
def test_plan_refuses_impossible_clusters(tmp_path: Path, kwargs: dict[str, int]) -> None:
    with pytest.raises(lc.LocalClusterError):
        lc.plan(lc.LocalClusterSpec(dir=tmp_path, **kwargs))  # type: ignore[arg-type]


@pytest.mark.usefixtures("fake_nodes")
def test_up_restart_down(tmp_path: Path) -> None:
    s = spec(tmp_path)
    state = lc.up(s, ready_timeout_ms=20_000)
    root = s.dir.resolve()
    saved = json.loads((root / "cluster.json").read_text())
    assert [n["node_id"] for n in saved["nodes"]] == ["seq1", "seq2", "st1", "st2", "st3"]
    assert saved["nodes"][0]["http"] == f"127.0.0.1:{s.base_port}"
    assert saved["nodes"][0]["roles"] == ["sequencer"]
    assert saved["epoch_store"] == f"file://{root / 'epochs'}"
    assert all(lc.node_alive(root, n) for n in state.nodes)
    assert state.sequencer_urls == [f"http://127.0.0.1:{s.base_port}",
                                    f"http://127.0.0.1:{s.base_port + 2}"]
    with pytest.raises(lc.LocalClusterError, match="already has a running cluster"):
        lc.up(s)

    new = lc.restart(root, "st2", ready_timeout_ms=20_000)
    old = next(n for n in state.nodes if n.node_id == "st2")
    assert new.pid != old.pid and not lc.node_alive(root, old) and lc.node_alive(root, new)
    reloaded = lc.load_state(root)
    assert reloaded is not None and reloaded.nodes[3].pid == new.pid

    assert sorted(lc.down(root)) == ["seq1", "seq2", "st1", "st2", "st3"]
    assert processes_mentioning(root) == []
    assert lc.down(root) == []


@pytest.mark.usefixtures("fake_nodes")
def test_failed_start_stops_everything_and_shows_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NODE_FAIL", "st1")
    s = spec(tmp_path)
    with pytest.raises(lc.LocalClusterError, match="boom: cannot start") as info:
        lc.up(s, ready_timeout_ms=20_000)
    assert "st1 exited" in str(info.value)
    assert processes_mentioning(s.dir.resolve()) == []
    assert not (s.dir / "cluster.json").exists()


@pytest.mark.usefixtures("fake_nodes")
def test_down_kills_a_node_that_ignores_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NODE_STUBBORN", "seq2")
    s = spec(tmp_path, storage_nodes=1, replication=1, sequencers=2)
    lc.up(s, ready_timeout_ms=20_000)
    lc.down(s.dir, stop_timeout_ms=300)
    assert processes_mentioning(s.dir.resolve()) == []


@pytest.mark.usefixtures("fake_nodes")
def test_cli_local_up_status_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "cli"
    base = lc.free_base_port(3)
    args = ["local", "up", "--dir", str(d), "--storage-nodes", "2", "--sequencers", "1",
            "--replication", "2", "--base-port", str(base), "--fsync", "interval"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "seq1" in out and "st2" in out and "running" in out
    config = json.loads((d / "st1" / "config.json").read_text())
    assert config["storage"]["fsync"] == "interval"
    assert cli.main(["local", "up", "--dir", str(d), "--base-port", str(base)]) == 1
    assert "already has a running cluster" in capsys.readouterr().err
    assert cli.main(["local", "status", "--dir", str(d)]) == 0
    assert cli.main(["local", "down", "--dir", str(d)]) == 0
    assert "stopped seq1, st1, st2" in capsys.readouterr().out
    assert processes_mentioning(d.resolve()) == []


def test_cli_arguments() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["read", "7", "--from", "e2n5", "--url", "a:1,b:2"])
    assert args.log_id == 7 and args.from_lsn == (2 << 32) + 5
    assert cli.target_urls(args) == ["a:1", "b:2"]
    assert parser.parse_args(["read", "7", "--from", "12"]).from_lsn == 12
    for bad in (["read", "0"], ["read", "x"], ["read", "1", "--from", "e1"],
                ["append", "1", "--url", "u", "--dir", "d"], ["local", "up"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_cli_formats_records_and_gaps() -> None:
    record = Record(lsn=Lsn((1 << 32) + 3), timestamp_ms=5, key=None, payload=b"hi\xff")
    assert cli.format_entry(record) == (
        f"e1n3\t{(1 << 32) + 3}\t1970-01-01T00:00:00.005Z\t-\thi\\xff")
    gap = Gap(type="BRIDGE", lo=Lsn(1), hi=Lsn(1 << 32))
    assert cli.format_entry(gap) == f"e0n1..e1n0\t1..{1 << 32}\t-\t-\tGAP BRIDGE"

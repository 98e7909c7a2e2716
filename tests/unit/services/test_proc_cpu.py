"""``loadtests.proc_cpu``: per-node CPU and context switches per record around a command."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from loadtests import proc_cpu


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux /proc only")
def test_it_reports_every_node_per_record_of_the_commands_last_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # This test process stands for the cluster's only node.
    (tmp_path / "cluster.json").write_text(json.dumps(
        {"nodes": [{"node_id": "seq1", "pid": os.getpid()}]}))
    burn = "x = sum(range(3_000_000)); print('noise'); print('{\"records\": 10}')"
    assert proc_cpu.main([str(tmp_path), sys.executable, "-c", burn]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[0]) == {"records": 10}
    node = json.loads(lines[1])
    assert node["node"] == "seq1" and set(node) == {
        "node", "user_us_per_record", "system_us_per_record",
        "voluntary_switches_per_record", "involuntary_switches_per_record"}
    # This process waited for the command: it switched out at least once.
    assert node["voluntary_switches_per_record"] > 0 and node["user_us_per_record"] >= 0


def test_a_failing_command_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(json.dumps({"nodes": []}))
    assert proc_cpu.main([str(tmp_path), sys.executable, "-c", "raise SystemExit(3)"]) == 3

"""Per-process CPU of a local cluster's nodes around one benchmark command: user and system
time and context switches (voluntary, involuntary; all threads) per record, read from
``/proc/PID/stat`` and ``/proc/PID/task/*/status`` before and after. Linux only.

The command must print a JSON line last with ``records`` (as ``loadtests.bench_append``
does); that line is printed again, then one line per node. The window includes the command's
warm-up, so figures are a few percent high (the same for both trees of an A/B).

Run from the repo root, e.g. where a round trip at 1 in flight goes:
``.venv/bin/python -m loadtests.proc_cpu DIR .venv/bin/python -m loadtests.bench_append
--dir DIR --inflight 1 --records 3000 --loop uvloop``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def snapshot(pid: int) -> tuple[float, float, int, int]:
    """(user s, system s, voluntary switches, involuntary switches) of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    voluntary = involuntary = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            lines = Path(f"/proc/{pid}/task/{task}/status").read_text().splitlines()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        for line in lines:
            if line.startswith("voluntary_ctxt_switches"):
                voluntary += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                involuntary += int(line.split()[1])
    return int(fields[11]) / ticks, int(fields[12]) / ticks, voluntary, involuntary


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    cluster_dir, command = Path(argv[0]), argv[1:]
    nodes = json.loads((cluster_dir / "cluster.json").read_text())["nodes"]
    pids = {node["node_id"]: node["pid"] for node in nodes}
    before = {node: snapshot(pid) for node, pid in pids.items()}
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    after = {node: snapshot(pid) for node, pid in pids.items()}
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        sys.stderr.write(done.stderr)
        return done.returncode or 1
    print(lines[-1])
    records = max(int(json.loads(lines[-1]).get("records", 1)), 1)
    for node in pids:
        user_s, system_s, voluntary, involuntary = (
            a - b for a, b in zip(after[node], before[node], strict=True))
        print(json.dumps({"node": node, "user_us_per_record": round(user_s / records * 1e6),
                          "system_us_per_record": round(system_s / records * 1e6),
                          "voluntary_switches_per_record": round(voluntary / records, 2),
                          "involuntary_switches_per_record": round(involuntary / records, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

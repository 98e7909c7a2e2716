"""Same-run A/B of node CPU per append: for each source tree given, start a local cluster
from it (1 sequencer, 3 storage nodes, R=3), drive it with ``bench_append --client raw``
(the lean HTTP load generator, run from this tree) and read every node's CPU time from
``/proc/<pid>/stat`` before and after. Prints one JSON line per tree: records/s, sequencer
CPU per append, the three storage nodes' CPU per append (and the bench's latencies). Linux
only.

Run from the repo root, e.g. the edge before and after a change:
``.venv/bin/python -m loadtests.ab_node_cpu --tree before=/path/to/main --tree after=.``
The cost of client authentication (docs/SECURITY.md), same tree with and without:
``... --tree open=. --tree auth=. --auth auth [--client seqlog]`` (labels given to ``--auth``
run ``local up --auth`` and the bench with its admin token).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WARMUP_RECORDS = 2000


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run(label: str, tree: Path, args: argparse.Namespace, here: Path) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix=f"ab-{label}-"))
    env = dict(os.environ, PYTHONPATH=str(tree))
    cli = [sys.executable, "-m", "services.cli", "local"]
    secure = label in (args.auth or [])
    subprocess.run([*cli, "up", "--dir", str(root), "--storage-nodes", "3", "--sequencers", "1",
                    "--replication", "3", "--fsync", args.fsync, "--base-port",
                    str(args.base_port), *(["--auth"] if secure else [])],
                   env=env, cwd=tree, check=True, capture_output=True)
    bench_env = dict(os.environ, PYTHONPATH=str(here))
    bench_env.pop("SEQLOG_TOKEN", None)
    if secure:
        bench_env["SEQLOG_TOKEN"] = (root / "auth" / "admin.token").read_text().strip()
    try:
        state = json.loads((root / "cluster.json").read_text())
        pids = {n["node_id"]: n["pid"] for n in state["nodes"]}
        before = {node: _cpu_s(pid) for node, pid in pids.items()}
        bench = subprocess.run(
            [sys.executable, "-m", "loadtests.bench_append", "--dir", str(root), "--client",
             args.client, "--inflight", str(args.inflight), "--records", str(args.records),
             "--warmup", str(WARMUP_RECORDS), "--loop", "uvloop"],
            env=bench_env, cwd=here, capture_output=True, text=True, check=True)
        after = {node: _cpu_s(pid) for node, pid in pids.items()}
    finally:
        subprocess.run([*cli, "down", "--dir", str(root)], env=env, cwd=tree,
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
    result = json.loads(bench.stdout.strip().splitlines()[-1])
    appends = args.records + WARMUP_RECORDS

    def per_append_us(sequencers: bool) -> float:
        spent_s = sum(after[n] - before[n] for n in pids if n.startswith("seq") == sequencers)
        return round(spent_s / appends * 1e6, 1)

    return {"bench": "seqlog_ab_node_cpu", "tree": label, "auth": secure,
            "client": args.client, "inflight": args.inflight,
            "records_per_s": result.get("records_per_s"), "p50_ms": result.get("p50_ms"),
            "p99_ms": result.get("p99_ms"), "errors": result.get("errors"),
            "sequencer_cpu_us_per_append": per_append_us(True),
            "storage_cpu_us_per_append_all_nodes": per_append_us(False)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", required=True,
                   help="LABEL=PATH of a source tree to run the cluster from (repeatable)")
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--inflight", type=int, default=256)
    p.add_argument("--fsync", choices=("always", "interval", "never"), default="always")
    p.add_argument("--base-port", type=int, default=19100)
    p.add_argument("--client", choices=("raw", "seqlog", "seqlog-http"), default="raw",
                   help="bench_append's client (raw: lean HTTP; seqlog: binary protocol)")
    p.add_argument("--auth", action="append",
                   help="a tree label to run with client authentication on (repeatable)")
    args = p.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    for spec in args.tree:
        label, _, path = spec.partition("=")
        print(json.dumps(_run(label, Path(path).resolve(), args, here)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

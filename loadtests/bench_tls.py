"""Same-run A/B of the cost of TLS and authentication on the write path (issue 18,
docs/BENCHMARKS.md): local clusters (1 sequencer, 3 storage nodes, R=3): one open, one
with node authentication by the cluster secret only (``secret``), one with that and client
authentication (``auth``: a signed bearer token in the client's HELLO, permissions checked on
every append), one as ``local up --secure`` makes it (``secure``: TLS on every listener and
link, mutual TLS between nodes, the cluster secret, client tokens), driven in turns by
``bench_append`` (``seqlog.Client`` over the binary protocol, 256 appends in flight by
default). For each run: records/s, and CPU per record of the sequencer, of the
storage nodes (summed) and of the client, from ``/proc/<pid>/stat``. Prints one JSON line per
run and a summary line with the ratios of the medians to the open cluster's. Linux only.

An arm may carry a variant after ``~`` (``secure~chacha``, ``open~asyncio``): the same cluster
with its nodes and client run under ``VARIANTS[variant]``'s environment: a TLS 1.3 cipher
suite forced through an OpenSSL config file (Python's ``ssl`` cannot choose TLS 1.3 suites),
or asyncio's own event loop (and its pure-Python TLS) instead of uvloop's.

Run from the repo root: ``.venv/bin/python -m loadtests.bench_tls --rounds 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from services import local_cluster as lc
from services import token_cli
from services.certs import make_secret
from shared.config import AuthConfig, TlsConfig
from shared.http_contract import TOKEN_ENV

CIPHER_SUITES = {"aes128": "TLS_AES_128_GCM_SHA256", "aes256": "TLS_AES_256_GCM_SHA384",
                 "chacha": "TLS_CHACHA20_POLY1305_SHA256"}
VARIANTS = (*CIPHER_SUITES, "asyncio")
_OPENSSL_CONF = """openssl_conf = openssl_init
[openssl_init]
ssl_conf = ssl_sect
[ssl_sect]
system_default = system_default_sect
[system_default_sect]
Ciphersuites = {suite}
"""


def _variant_env(root: Path, variant: str) -> dict[str, str]:
    """The environment of an arm's nodes and client (see the module doc)."""
    if not variant:
        return {}
    if variant == "asyncio":
        return {"SEQLOG_EVENT_LOOP": "asyncio"}
    conf = root / "openssl.cnf"
    conf.write_text(_OPENSSL_CONF.format(suite=CIPHER_SUITES[variant]))
    return {"OPENSSL_CONF": str(conf)}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _bench(root: Path, args: argparse.Namespace, label: str) -> dict[str, object]:
    state = lc.load_state(root)
    assert state is not None
    pids = {n.node_id: (n.pid, n.roles[0]) for n in state.nodes}
    before = {node: _cpu_s(pid) for node, (pid, _) in pids.items()}
    token = token_cli.local_admin_token(root)
    variant = label.partition("~")[2]
    env = {**os.environ, **_variant_env(root, variant), **({TOKEN_ENV: token} if token else {})}
    run = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_append", "--dir", str(root), "--inflight",
         str(args.inflight), "--records", str(args.records), "--warmup", str(args.warmup),
         "--size", str(args.size), "--loop", "asyncio" if variant == "asyncio" else "uvloop",
         "--label", label],
        capture_output=True, text=True, check=True, env=env)
    after = {node: _cpu_s(pid) for node, (pid, _) in pids.items()}
    out = json.loads(run.stdout.strip().splitlines()[-1])
    measured = args.records + args.warmup  # node CPU covers the warmup too
    cpu = {role: sum(after[n] - before[n] for n, (_, r) in pids.items() if r == role)
           for role in ("sequencer", "storage")}
    return {"label": label, "records_per_s": out["records_per_s"],
            "p50_ms": out["p50_ms"], "p99_ms": out["p99_ms"],
            # The bench's own reading covers the measured phase only; the storage nodes'
            # covers the warmup too (the same share in both arms).
            "sequencer_cpu_us_per_record": out["sequencer_cpu_us_per_record"]
            or round(cpu["sequencer"] / measured * 1e6, 2),
            "storage_cpu_us_per_record": round(cpu["storage"] / measured * 1e6, 2),
            "client_cpu_us_per_record": out.get("client_cpu_us_per_record")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--inflight", type=int, default=256)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--fsync", default="never", choices=("always", "never"))
    parser.add_argument("--arms", default="open,secret,auth,secure",
                        help="clusters, comma-separated: open* (no security; open2 etc. are "
                             "A/A controls), secret, auth, secure; the first is the baseline")
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for arm in arms:
        if arm.partition("~")[2] not in ("", *VARIANTS):
            parser.error(f"unknown variant in {arm!r}: one of {', '.join(VARIANTS)}")
    roots = {name: Path(tempfile.mkdtemp(prefix=f"bench-tls-{name}-")) for name in arms}
    try:
        for arm, root in roots.items():
            name = arm.partition("~")[0]
            tls = None
            if name in ("secret", "auth"):
                tls = TlsConfig(cluster_secret_file=str(make_secret(root / "cluster-secret")))
            # As ``local up --secure`` / ``--auth``: an admin token the bench's client sends.
            auth = (token_cli.write_local_auth(root) if name in ("auth", "secure")
                    else AuthConfig())
            saved = dict(os.environ)
            os.environ.update(_variant_env(root, arm.partition("~")[2]))  # the nodes inherit it
            try:
                lc.up(lc.LocalClusterSpec(dir=root, storage_nodes=3, sequencers=1,
                                          replication=3, base_port=lc.free_base_port(4),
                                          fsync=args.fsync, secure=name == "secure", tls=tls,
                                          auth=auth),
                      ready_timeout_ms=60_000)
            finally:
                os.environ.clear()
                os.environ.update(saved)
        runs: dict[str, list[dict[str, object]]] = {name: [] for name in roots}
        for round_index in range(args.rounds):
            # Each round starts with another arm, so no arm always runs right after another.
            shift = round_index % len(arms)
            for name in arms[shift:] + arms[:shift]:
                result = _bench(roots[name], args, name)
                runs[name].append(result)
                print(json.dumps(result), flush=True)
        keys = ("records_per_s", "sequencer_cpu_us_per_record", "storage_cpu_us_per_record",
                "client_cpu_us_per_record")
        medians = {name: {k: statistics.median(float(r[k]) for r in rs)  # type: ignore[arg-type]
                          for k in keys} for name, rs in runs.items()}
        base = arms[0]
        ratios = {name: {k: round(medians[name][k] / medians[base][k], 3) for k in keys}
                  for name in arms[1:]}
        # Paired: each round's ratio to the base arm of the same round, then their median
        # (steadier than a ratio of medians when the machine's load drifts between rounds).
        paired = {name: {k: round(statistics.median(
            float(r[k]) / float(b[k])  # type: ignore[arg-type]
            for r, b in zip(runs[name], runs[base], strict=True)), 3) for k in keys}
            for name in arms[1:]}
        print(json.dumps({"summary": f"ratios to {base}", "inflight": args.inflight,
                          "fsync": args.fsync, "medians": medians, "ratios": ratios,
                          "paired_ratios": paired}),
              flush=True)
    finally:
        for root in roots.values():
            lc.down(root)
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

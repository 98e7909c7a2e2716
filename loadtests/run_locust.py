"""Runs Locust headless against a Seqlog cluster and writes CSV, HTML, JSON and Markdown
reports; ``capacity`` steps the offered append load up until p99 or errors pass a limit.

    python -m loadtests.run_locust mixed --duration-s 20 --report-dir /tmp/seqlog-locust
    python -m loadtests.run_locust capacity --report-dir /tmp/seqlog-capacity

Without ``--url`` or ``--dir`` it starts a local cluster (3 storage nodes, 2 sequencers,
R=3, ``fsync=always`` unless told otherwise) in a temporary directory and stops it after.
Exit codes: 0 the run worked and nothing failed unexpectedly, 1 some requests failed (or no
load step met the criteria), 2 the run itself did not work.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from loadtests.cpu_watch import CpuUse, CpuWatch
from loadtests.locust_report import (
    EndpointStats,
    Step,
    read_stats,
    step_from_stats,
    write_capacity_report,
    write_run_report,
)
from services import local_cluster as lc
from services import token_cli
from shared.config import FSYNC_MODES, AuthConfig

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
LOCUST_GRACE_S = 60.0
"""Locust start-up and shutdown on top of ``--run-time`` before the run counts as hung."""
CPU_WARMUP_S = 3.0
CAPACITY_CLASSES = ("Producer",)


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    url: str
    cluster_pids: list[int]
    description: str
    token: str | None = None
    """Bearer token of a cluster with auth on: the users send it (``SEQLOG_TOKEN``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    rows: list[EndpointStats]
    cpu: CpuUse
    exit_code: int


@contextmanager
def cluster(args: argparse.Namespace) -> Iterator[Target]:
    """The cluster to load: ``--url``, the one recorded in ``--dir``, or a new local one."""
    if args.url:
        yield Target(url=args.url.rstrip("/"), cluster_pids=[], description=args.url)
        return
    if args.dir:
        state = lc.load_state(Path(args.dir))
        if state is None or not state.sequencer_urls:
            raise lc.LocalClusterError(f"no running cluster recorded in {args.dir}")
        yield Target(url=state.sequencer_urls[0], cluster_pids=[n.pid for n in state.nodes],
                     description=f"local cluster in {args.dir}",
                     token=token_cli.local_admin_token(Path(args.dir)))
        return
    with tempfile.TemporaryDirectory(prefix="seqlog-locust-") as tmp:
        root = Path(tmp)
        spec = lc.LocalClusterSpec(
            dir=root, storage_nodes=args.storage_nodes, sequencers=args.sequencers,
            replication=args.replication, fsync=args.fsync,
            base_port=lc.free_base_port(args.storage_nodes + args.sequencers),
            auth=token_cli.write_local_auth(root) if args.auth else AuthConfig(),
        )
        state = lc.up(spec, ready_timeout_ms=60_000)
        try:
            yield Target(
                url=state.sequencer_urls[0], cluster_pids=[n.pid for n in state.nodes],
                description=(f"new local cluster: {args.storage_nodes} storage, "
                             f"{args.sequencers} sequencers, R={args.replication}, "
                             f"fsync={args.fsync}{', auth on' if args.auth else ''}"),
                token=token_cli.local_admin_token(root) if args.auth else None)
        finally:
            lc.down(root)


def run_locust(target: Target, *, prefix: Path, users: int, spawn_rate: float,
               duration_s: int, processes: int, extra: list[str]) -> RunResult:
    """One headless Locust run writing ``{prefix}_stats.csv`` etc. and ``{prefix}.html``."""
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "--host", target.url, "-u", str(users), "-r", str(spawn_rate),
        "-t", f"{duration_s}s", "--csv", str(prefix), "--html", f"{prefix}.html",
        "--only-summary", "--reset-stats", "--stop-timeout", "2", "--loglevel", "WARNING",
    ]
    if processes > 1:
        command += ["--processes", str(processes)]
    command += extra
    with open(f"{prefix}.log", "wb") as log:
        env = dict(os.environ)
        if target.token:
            env["SEQLOG_TOKEN"] = target.token
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, env=env)
        watch = CpuWatch(process.pid, target.cluster_pids, warmup_s=CPU_WARMUP_S)
        watch.start()
        try:
            exit_code = process.wait(timeout=duration_s + LOCUST_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise RuntimeError(f"locust did not finish; see {prefix}.log") from None
        finally:
            cpu = watch.stop()
    stats = Path(f"{prefix}_stats.csv")
    if not stats.exists():
        raise RuntimeError(f"locust wrote no {stats} (exit {exit_code}); see {prefix}.log")
    return RunResult(rows=read_stats(stats), cpu=cpu, exit_code=exit_code)


def seqlog_args(args: argparse.Namespace) -> list[str]:
    extra = ["--seqlog-logs", str(args.logs), "--seqlog-log-base", str(args.log_base),
             "--seqlog-zipf-s", str(args.zipf_s), "--seqlog-record-size", args.record_size,
             "--seqlog-batch-records", str(args.batch_records)]
    return extra


def cmd_mixed(args: argparse.Namespace, target: Target, report_dir: Path) -> int:
    extra = [*seqlog_args(args), "--seqlog-producer-rate", str(args.producer_rate),
             "--seqlog-wait-ms", str(args.wait_ms), *args.classes]
    result = run_locust(target, prefix=report_dir / "locust", users=args.users,
                        spawn_rate=args.spawn_rate, duration_s=args.duration_s,
                        processes=args.processes, extra=extra)
    meta = {"target": target.description, "users": args.users, "duration_s": args.duration_s,
            "processes": args.processes, "record_size": args.record_size,
            "logs": args.logs, "zipf_s": args.zipf_s, "locust_exit": result.exit_code}
    write_run_report(report_dir, result.rows, result.cpu, meta)
    print((report_dir / "summary.md").read_text())
    failures = sum(r.failures for r in result.rows if r.method)
    reasons = report_dir / "locust_failures.csv"
    if failures and reasons.exists():
        # Which answers failed, not only how many: what a CI log must show to be diagnosed.
        print(f"Failures ({reasons.name}):\n{reasons.read_text()}")
    return 1 if failures else 0


def offered_steps(start_rps: float, factor: float, steps_max: int) -> list[float]:
    return [start_rps * factor ** i for i in range(steps_max)]


def cmd_capacity(args: argparse.Namespace, target: Target, report_dir: Path) -> int:
    steps: list[Step] = []
    meta = {"target": target.description, "step_duration_s": args.step_duration_s,
            "rate_per_user": args.rate_per_user, "processes": args.processes,
            "record_size": args.record_size, "logs": args.logs, "zipf_s": args.zipf_s}
    for index, offered_rps in enumerate(offered_steps(args.start_rps, args.step_factor,
                                                      args.steps_max)):
        users = max(1, math.ceil(offered_rps / args.rate_per_user))
        rate = offered_rps / users
        extra = [*seqlog_args(args), "--seqlog-producer-rate", f"{rate:.4f}",
                 *CAPACITY_CLASSES]
        result = run_locust(target, prefix=report_dir / f"step-{index + 1:02d}", users=users,
                            spawn_rate=users, duration_s=args.step_duration_s,
                            processes=args.processes, extra=extra)
        step = step_from_stats(result.rows, offered_rps=offered_rps, users=users,
                               cpu=result.cpu)
        steps.append(step)
        print(f"step {index + 1}: offered {offered_rps:,.0f}/s users {users} achieved "
              f"{step.achieved_rps:,.0f}/s p50 {step.p50_ms:.0f} ms p99 {step.p99_ms:.0f} ms "
              f"errors {step.error_ratio:.1%} locust {step.cpu.generator_core_max:.0%} core",
              flush=True)
        # Only consecutive misses end the search: one noisy step must not hide the knee.
        recent = steps[-(args.steps_after_limit + 1):]
        if len(recent) > args.steps_after_limit and not any(
                s.within(args.p99_threshold_ms, args.error_ratio_max) for s in recent):
            break
    doc = write_capacity_report(report_dir, steps, p99_threshold_ms=args.p99_threshold_ms,
                                error_ratio_max=args.error_ratio_max, meta=meta)
    print((report_dir / "capacity.md").read_text())
    print(json.dumps({"knee": doc["knee"]}, indent=2))
    return 0 if doc["knee"] else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m loadtests.run_locust",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_argument_group("cluster")
    where.add_argument("--url", help="load an existing cluster through this node's HTTP URL")
    where.add_argument("--dir", help="load the local cluster recorded in DIR/cluster.json")
    where.add_argument("--storage-nodes", type=int, default=3)
    where.add_argument("--sequencers", type=int, default=2)
    where.add_argument("--replication", type=int, default=3)
    where.add_argument("--fsync", choices=list(FSYNC_MODES), default="always")
    where.add_argument("--auth", action="store_true",
                       help="a new local cluster with auth on; the users send its admin "
                            "token (docs/SECURITY.md)")
    load = common.add_argument_group("load")
    load.add_argument("--report-dir", default="locust-report")
    load.add_argument("--processes", type=int, default=1, help="Locust worker processes")
    load.add_argument("--logs", type=int, default=100)
    load.add_argument("--log-base", type=int, default=0,
                      help="first log id (default: random, so runs do not share logs)")
    load.add_argument("--zipf-s", type=float, default=1.1)
    load.add_argument("--record-size", default="lognormal:512:1.0",
                      help="fixed:N | uniform:LO:HI | lognormal:MEDIAN:SIGMA | choice:A,B")
    load.add_argument("--batch-records", type=int, default=16)

    mixed = sub.add_parser("mixed", parents=[common], help="all traffic profiles at once")
    mixed.add_argument("--users", type=int, default=20)
    mixed.add_argument("--spawn-rate", type=float, default=10.0)
    mixed.add_argument("--duration-s", type=int, default=20)
    mixed.add_argument("--producer-rate", type=float, default=10.0,
                       help="appends or batches per second per producer user")
    mixed.add_argument("--wait-ms", type=int, default=1000, help="tailing long-poll wait")
    mixed.add_argument("classes", nargs="*", help="Locust user classes (default: all)")

    capacity = sub.add_parser("capacity", parents=[common],
                              help="step single-record append load up to the knee")
    capacity.add_argument("--start-rps", type=float, default=25.0)
    capacity.add_argument("--step-factor", type=float, default=2.0)
    capacity.add_argument("--steps-max", type=int, default=10)
    capacity.add_argument("--step-duration-s", type=int, default=15)
    capacity.add_argument("--rate-per-user", type=float, default=20.0,
                          help="appends/s per Locust user (each has one request in flight)")
    capacity.add_argument("--p99-threshold-ms", type=float, default=10.0)
    capacity.add_argument("--error-ratio-max", type=float, default=0.01)
    capacity.add_argument("--steps-after-limit", type=int, default=2,
                          help="stop after this many further consecutive steps miss the "
                               "criteria (the plot then shows the curve past the knee)")
    args = parser.parse_args(argv)
    if args.url and args.dir:
        parser.error("give --url or --dir, not both")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.log_base:
        args.log_base = int.from_bytes(os.urandom(3), "big") * 1000 + 1
    report_dir = Path(args.report_dir).resolve()
    report_dir.mkdir(parents=True, exist_ok=True)
    try:
        with cluster(args) as target:
            if args.command == "mixed":
                return cmd_mixed(args, target, report_dir)
            return cmd_capacity(args, target, report_dir)
    except (lc.LocalClusterError, RuntimeError, OSError) as exc:
        print(f"run_locust: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

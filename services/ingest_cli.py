"""``seqlog ingest``: runs the Spark ingest job (``python -m spark_ingest.job``) in place of
this process.

The job lives in the ``spark_ingest`` package, which sits beside ``services`` (neither imports
the other), so this module only declares the command's options, turns ``--dir`` (a local
cluster) into node URLs, and execs the job: signals (SIGINT, SIGTERM, SIGKILL) then reach the
Spark driver directly and its exit code is the command's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from services import local_cluster as lc

TRIGGERS = ("available-now", "continuous-interval")
_SOURCE_ROOT = str(Path(__file__).resolve().parent.parent)
# Options passed on to the job unchanged: (flag, keyword arguments for add_argument).
_OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--logs", {"required": True, "help": "log ids, e.g. 1,2,5-9"}),
    ("--to", {"required": True, "help": "output directory (Parquet, partitioned by log_id "
                                        "and date)"}),
    ("--checkpoint", {"required": True, "help": "Spark checkpoint directory (keep it to "
                                                "resume exactly where the job stopped)"}),
    ("--trigger", {"choices": TRIGGERS, "help": "available-now: ingest what is released now, "
                   "then stop; continuous-interval: a micro-batch every --interval-ms until "
                   "stopped (default)"}),
    ("--interval-ms", {"help": "micro-batch interval of continuous-interval (default 1000)"}),
    ("--master", {"help": "Spark master (default local[*]; e.g. local[2], spark://host:7077)"}),
    ("--max-records-per-trigger", {"help": "most records per micro-batch"}),
    ("--starting-offsets", {"help": "where a new checkpoint starts: earliest (default), "
                                    "latest, or JSON per-log LSNs like '{\"7\": 1234}'"}),
    ("--starting-timestamp-ms", {"help": "start each log at its first record at or after this "
                                         "time (milliseconds since the Unix epoch)"}),
    ("--fail-on-data-loss", {"choices": ("true", "false"), "help": "fail when records were "
                             "trimmed or lost before they were read (default true), or skip "
                             "and report them"}),
    ("--payload-format", {"choices": ("binary", "json", "msgpack")}),
    ("--payload-schema", {"help": "DDL of payload fields to decode into columns"}),
    ("--records-per-partition", {"help": "most records per Spark task"}),
    ("--records-per-read", {"help": "records per read request"}),
    ("--progress-interval-ms", {"help": "progress table every this often (default 5000)"}),
    ("--conf", {"action": "append", "metavar": "KEY=VALUE",
                "help": "Spark configuration (repeatable)"}),
)


def add_parser(commands: Any) -> None:
    """Registers ``ingest`` on the ``seqlog`` command's subparsers."""
    ingest = commands.add_parser(
        "ingest", help="copy released records into Parquet with Spark, exactly once",
        description="Runs a Spark Structured Streaming job from the seqlog source into "
                    "Parquet (see spark_ingest/README.md).")
    for flag, kwargs in _OPTIONS:
        ingest.add_argument(flag, **kwargs)
    target = ingest.add_mutually_exclusive_group()
    target.add_argument("--url", action="append", help="node URL (repeatable or comma-separated)")
    target.add_argument("--dir", type=Path, help="local cluster directory (reads cluster.json)")


def job_argv(args: argparse.Namespace, default_url: str) -> list[str]:
    """The job's command line for parsed ``seqlog ingest`` arguments."""
    if args.dir is not None:
        state = lc.load_state(args.dir.resolve())
        if state is None:
            raise lc.LocalClusterError(f"no {lc.STATE_FILE} in {args.dir}")
        urls = state.sequencer_urls
    else:
        urls = args.url or [os.environ.get("SEQLOG_URL", default_url)]
    argv = [sys.executable, "-m", "spark_ingest.job", "--url", ",".join(urls)]
    for flag, _ in _OPTIONS:
        value = getattr(args, flag[2:].replace("-", "_"))
        for item in value if isinstance(value, list) else [value]:
            if item is not None:
                argv += [flag, str(item)]
    return argv


def run(args: argparse.Namespace, default_url: str) -> int:
    """Execs the job; returns only if that fails."""
    argv = job_argv(args, default_url)
    env = dict(os.environ)
    # In a source checkout spark_ingest sits beside services; make it importable anywhere.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_SOURCE_ROOT, env.get("PYTHONPATH", "")) if p)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, env)
    return 1  # not reached: execve replaces this process or raises OSError

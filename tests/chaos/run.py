"""Command line for chaos runs:

    python -m tests.chaos.run --seed N --duration-s S [--dir DIR] [--large]
    python -m tests.chaos.run --check DIR/history.jsonl

The first prints the seed at once, then one JSON summary (figures, the first violations, the
history's path), and exits 1 if any check failed, 2 if the harness itself failed. The same
seed replays the same fault schedule. ``--check`` runs the offline checkers again over a
recorded history.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import tempfile
from pathlib import Path

from tests.chaos import checkers
from tests.chaos.harness import ChaosConfig, HarnessError, run
from tests.chaos.history import load

SMALL = {"sequencers": 2, "storage_nodes": 3, "replication": 2}
LARGE = {"sequencers": 3, "storage_nodes": 4, "replication": 3}


def config_for(seed: int, duration_s: float, *, large: bool,
               disk_faults: bool = False) -> ChaosConfig:
    shape = LARGE if large else SMALL
    return ChaosConfig(seed=seed, duration_s=duration_s, disk_faults=disk_faults,
                       **shape)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--duration-s", type=float, default=75.0,
                        help="length of the fault phase (the run takes about 60 s more)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="run directory (default: a new one under the temp dir)")
    parser.add_argument("--large", action="store_true",
                        help="3 sequencer nodes, 4 storage nodes, R=3 (default 2, 3, R=2)")
    parser.add_argument("--disk-faults", action="store_true",
                        help="also replace storage nodes' disks (kill -9, wipe, restart, wait "
                        "for the rebuild), one at a time")
    parser.add_argument("--auth", action="store_true",
                        help="client authentication on (docs/SECURITY.md)")
    parser.add_argument("--check", type=Path, default=None, metavar="HISTORY",
                        help="only run the checkers over a recorded history.jsonl")
    args = parser.parse_args(argv)
    if args.check is not None:
        events = load(args.check)
        violations = checkers.check(events)
        print(json.dumps({"figures": checkers.figures(events, violations),
                          "violations": [v.as_dict() for v in violations[:50]]}, indent=2))
        return 1 if violations else 0
    seed = args.seed if args.seed is not None else random.randrange(1, 2**31)
    print(f"seed {seed}", flush=True)
    run_dir = args.dir or Path(tempfile.mkdtemp(prefix=f"seqlog-chaos-{seed}-"))
    try:
        config = dataclasses.replace(config_for(seed, args.duration_s, large=args.large,
                                                disk_faults=args.disk_faults),
                                     auth=args.auth)
        result = asyncio.run(run(config, run_dir))
    except HarnessError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(json.dumps(result.summary(), indent=2), flush=True)
    if result.violations:
        print(result.failure_message(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Command line: ``python -m tests.simulation.run --seed N [--seeds A..B] [--fault F] [-v]``.

Runs the randomized simulation of each seed, prints one line per seed (or the failure report
with its ``reproduce with`` line), and exits 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.simulation.runner import SimulationFailure, run_simulation
from tests.simulation.sim_options import OPT_IN_FAULTS


def parse_seeds(text: str) -> range:
    """``A..B`` (inclusive) or a single number."""
    low, _, high = text.partition("..")
    first = int(low)
    return range(first, (int(high) if high else first) + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation.run",
                                     description="Deterministic simulation of Seqlog clusters")
    parser.add_argument("--seed", type=int, help="run one seed")
    parser.add_argument("--seeds", type=parse_seeds, help="run seeds A..B (inclusive)")
    parser.add_argument("--fault", action="append", default=[], choices=sorted(OPT_IN_FAULTS),
                        help="add an opt-in fault kind (each finds a known open defect)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print every trace line to stderr")
    args = parser.parse_args(argv)
    seeds: list[int] = []
    if args.seed is not None:
        seeds.append(args.seed)
    if args.seeds is not None:
        seeds.extend(args.seeds)
    if not seeds:
        parser.error("give --seed N or --seeds A..B")
    failed: list[int] = []
    started_s = time.perf_counter()
    for seed in seeds:
        try:
            result = run_simulation(seed, faults=frozenset(args.fault), verbose=args.verbose)
        except SimulationFailure as failure:
            failed.append(seed)
            print(f"seed {seed}: FAILED\n{failure}\n", flush=True)
            continue
        print(result.summary(), flush=True)
    elapsed_s = time.perf_counter() - started_s
    print(f"{len(seeds) - len(failed)}/{len(seeds)} seeds passed in {elapsed_s:.1f}s "
          f"({len(seeds) / max(elapsed_s, 1e-9):.1f} seeds/s)"
          + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

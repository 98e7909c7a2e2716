"""Fault-injection ("chaos") suite: real node processes on 127.0.0.1 with a TCP proxy on every
node-to-node link, a seeded fault schedule (kill -9, SIGSTOP/SIGCONT, partitions, one-way
cuts, delays, restarts with failpoints armed), concurrent writers and tailing readers through
different nodes, a JSONL history and offline checkers.

- ``pytest tests/chaos`` runs the unit tests of the parts and one small seeded run (about two
  minutes); ``--run-slow`` adds longer multi-seed runs on a larger cluster.
- ``python -m tests.chaos.run --seed N --duration-s S [--large]`` runs one seed and prints
  the seed, then a JSON summary; it exits non-zero on any violation. The same seed replays
  the same fault schedule.
- ``python -m tests.chaos.run --check DIR/history.jsonl`` re-runs the checkers on a history.

Modules: ``harness`` (the run), ``faults`` (the schedule), ``proxy`` (the link proxy),
``workload``, ``history``, ``checkers``, ``run`` (the command line).
"""

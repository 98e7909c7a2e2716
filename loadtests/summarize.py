"""Print a Markdown table (median over repetitions) of benchmark JSON lines.

    python -m loadtests.summarize /tmp/seqlog-bench.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def main(path: str) -> None:
    rows: dict[tuple[str, int, int], list[dict[str, float]]] = defaultdict(list)
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip().startswith("{"):
                d = json.loads(line)
                bench = d.get("bench", "?")
                if d.get("client") == "raw":
                    bench += " (raw HTTP client)"
                if bench == "seqlog_buffered":
                    bench += f" ({d.get('payload')}, {d.get('compression')})"
                key = (bench, int(d.get("inflight", 0)), int(d.get("batch", 1)))
                rows[key].append(d)
    print("| system | in-flight | batch | records/s | p50 ms | p99 ms | client CPU | runs |")
    print("|---|---|---|---|---|---|---|---|")
    for (bench, inflight, batch), runs in rows.items():
        def med(field: str, runs: list[dict[str, float]] = runs) -> float:
            values = [float(r[field]) for r in runs if r.get(field) is not None]
            return statistics.median(values) if values else float("nan")
        print(f"| {bench} | {inflight} | {batch} | {med('records_per_s'):,.0f} | "
              f"{med('p50_ms'):.2f} | {med('p99_ms'):.2f} | {med('client_cpu_util'):.2f} | "
              f"{len(runs)} |")


if __name__ == "__main__":
    main(sys.argv[1])

"""Reading Locust's CSV statistics and writing the run and capacity-search reports.

Locust's ``*_stats.csv`` is parsed rather than its ``--json`` output because with
``--processes`` the latter prints one document per process. Percentile columns are whole
milliseconds (Locust rounds), which is precise enough for a p99 threshold of a few ms.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtests.cpu_watch import CpuUse

BACKPRESSURE_SUFFIX = " [429 backpressure]"
"""Must match ``loadtests/locustfile.py``: 429 answers are counted under this name."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointStats:
    method: str
    name: str
    requests: int
    failures: int
    requests_per_s: float
    failures_per_s: float
    avg_ms: float
    p50_ms: float
    p99_ms: float
    max_ms: float


def read_stats(path: Path) -> list[EndpointStats]:
    """Rows of a Locust ``*_stats.csv`` (the ``Aggregated`` row included, method ``""``)."""
    rows: list[EndpointStats] = []
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            def num(column: str, row: dict[str, str] = row) -> float:
                value = row.get(column) or "0"
                return 0.0 if value == "N/A" else float(value)

            rows.append(EndpointStats(
                method=row.get("Type", ""), name=row["Name"], requests=int(num("Request Count")),
                failures=int(num("Failure Count")), requests_per_s=num("Requests/s"),
                failures_per_s=num("Failures/s"), avg_ms=num("Average Response Time"),
                p50_ms=num("50%"), p99_ms=num("99%"), max_ms=num("Max Response Time"),
            ))
    return rows


def by_name(rows: list[EndpointStats]) -> dict[str, EndpointStats]:
    return {r.name: r for r in rows}


# -- a single (mixed traffic) run ------------------------------------------------------------


def cpu_dict(cpu: CpuUse) -> dict[str, Any]:
    return {**asdict(cpu), "other_cores": cpu.other_cores, "generator_bound": cpu.generator_bound,
            "machine_bound": cpu.machine_bound}


def cpu_sentence(cpu: CpuUse) -> str:
    text = (f"Locust used {cpu.generator_cores:.2f} cores (busiest process "
            f"{cpu.generator_core_max:.0%} of a core), the Seqlog nodes {cpu.cluster_cores:.2f} "
            f"cores, other processes {cpu.other_cores:.2f} cores; the machine was "
            f"{cpu.machine_busy:.0%} busy ({cpu.cores} cores).")
    if cpu.generator_bound:
        text += (" **The load generator was the limit** (a Locust process near 100 % of a "
                 "core): add `--processes` or a faster client, Seqlog was not saturated by it.")
    elif cpu.machine_bound:
        text += (" The machine's CPUs were saturated: generator and cluster compete for the "
                 "same cores, so the figures are a lower bound for Seqlog alone.")
    return text


def write_run_report(report_dir: Path, rows: list[EndpointStats], cpu: CpuUse,
                     meta: dict[str, Any]) -> dict[str, Any]:
    """``summary.json`` and ``summary.md`` of one run; returns the JSON document."""
    doc = {"meta": meta, "cpu": cpu_dict(cpu), "endpoints": [asdict(r) for r in rows]}
    (report_dir / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        "# Seqlog Locust run", "",
        ", ".join(f"{k}={v}" for k, v in meta.items()), "",
        "| endpoint | requests | failures | req/s | avg ms | p50 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r.requests:
            continue
        label = f"{r.method} {r.name}".strip()
        lines.append(f"| {label} | {r.requests} | {r.failures} | {r.requests_per_s:,.1f} | "
                     f"{r.avg_ms:.1f} | {r.p50_ms:.0f} | {r.p99_ms:.0f} | {r.max_ms:.0f} |")
    lines += ["", cpu_sentence(cpu), ""]
    (report_dir / "summary.md").write_text("\n".join(lines))
    return doc


# -- capacity search -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    offered_rps: float
    users: int
    achieved_rps: float
    """Successful appends per second."""
    backpressure_rps: float
    p50_ms: float
    p99_ms: float
    avg_ms: float
    error_ratio: float
    """(failures + 429 answers) / all append answers."""
    cpu: CpuUse

    def within(self, p99_threshold_ms: float, error_ratio_max: float) -> bool:
        return self.p99_ms <= p99_threshold_ms and self.error_ratio <= error_ratio_max


def step_from_stats(rows: list[EndpointStats], *, offered_rps: float, users: int,
                    cpu: CpuUse, endpoint: str = "append") -> Step:
    named = by_name(rows)
    main = named.get(endpoint)
    pushed_back = named.get(endpoint + BACKPRESSURE_SUFFIX)
    requests = main.requests if main else 0
    failures = main.failures if main else 0
    rejected = pushed_back.requests if pushed_back else 0
    answered = requests + rejected
    return Step(
        offered_rps=offered_rps, users=users,
        achieved_rps=(main.requests_per_s - main.failures_per_s) if main else 0.0,
        backpressure_rps=pushed_back.requests_per_s if pushed_back else 0.0,
        p50_ms=main.p50_ms if main else 0.0, p99_ms=main.p99_ms if main else 0.0,
        avg_ms=main.avg_ms if main else 0.0,
        error_ratio=(failures + rejected) / answered if answered else 1.0, cpu=cpu,
    )


def step_dict(step: Step) -> dict[str, Any]:
    doc = asdict(step)
    doc["cpu"] = cpu_dict(step.cpu)
    return doc


def write_capacity_report(report_dir: Path, steps: list[Step], *, p99_threshold_ms: float,
                          error_ratio_max: float, meta: dict[str, Any]) -> dict[str, Any]:
    """``capacity.json``, ``capacity.md`` and ``capacity.png``; returns the JSON document."""
    passing = [s for s in steps if s.within(p99_threshold_ms, error_ratio_max)]
    knee = passing[-1] if passing else None
    after_knee = steps[steps.index(knee) + 1:] if knee else steps
    first_over = next(
        (s for s in after_knee if not s.within(p99_threshold_ms, error_ratio_max)), None)
    limited_by_generator = any(s.cpu.generator_bound for s in steps)
    doc: dict[str, Any] = {
        "meta": meta, "p99_threshold_ms": p99_threshold_ms, "error_ratio_max": error_ratio_max,
        "knee": step_dict(knee) if knee else None,
        "first_over": step_dict(first_over) if first_over else None,
        "generator_bound": limited_by_generator,
        "steps": [step_dict(s) for s in steps],
    }
    (report_dir / "capacity.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot_capacity(report_dir / "capacity.png", steps, knee=knee,
                  p99_threshold_ms=p99_threshold_ms)
    (report_dir / "capacity.md").write_text(_capacity_markdown(
        steps, knee, first_over, p99_threshold_ms=p99_threshold_ms,
        error_ratio_max=error_ratio_max, meta=meta))
    return doc


def _capacity_markdown(steps: list[Step], knee: Step | None, first_over: Step | None, *,
                       p99_threshold_ms: float, error_ratio_max: float,
                       meta: dict[str, Any]) -> str:
    lines = ["# Seqlog capacity search", "",
             ", ".join(f"{k}={v}" for k, v in meta.items()), "",
             f"Criteria: p99 append latency <= {p99_threshold_ms:g} ms and errors "
             f"(failures + 429 backpressure) <= {error_ratio_max:.0%}.", ""]
    if knee is not None:
        lines.append(f"**Knee: {knee.offered_rps:,.0f} appends/s offered, "
                     f"{knee.achieved_rps:,.0f} appends/s achieved, p50 {knee.p50_ms:.0f} ms, "
                     f"p99 {knee.p99_ms:.0f} ms** ({knee.users} users).")
    else:
        lines.append("**No knee: even the lowest offered load missed the criteria** (the "
                     "latency floor is above the threshold; see the first step).")
    if first_over is not None:
        which = "The next step" if knee is not None else "The first step"
        lines.append(f"{which} ({first_over.offered_rps:,.0f}/s offered) reached "
                     f"{first_over.achieved_rps:,.0f}/s with p99 {first_over.p99_ms:.0f} ms "
                     f"and {first_over.error_ratio:.1%} errors.")
    below_knee = steps[:steps.index(knee)] if knee is not None else []
    noisy = [s for s in below_knee if not s.within(p99_threshold_ms, error_ratio_max)]
    if noisy:
        lines.append(f"{len(noisy)} lower step(s) missed the criteria too (noise: see the "
                     "other-cores column).")
    lines += ["", "| offered/s | users | achieved/s | 429/s | p50 ms | p99 ms | avg ms | "
              "errors | Locust cores (max proc) | cluster cores | other cores | machine busy |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in steps:
        lines.append(
            f"| {s.offered_rps:,.0f} | {s.users} | {s.achieved_rps:,.0f} | "
            f"{s.backpressure_rps:,.0f} | {s.p50_ms:.0f} | {s.p99_ms:.0f} | {s.avg_ms:.1f} | "
            f"{s.error_ratio:.1%} | {s.cpu.generator_cores:.2f} ({s.cpu.generator_core_max:.0%})"
            f" | {s.cpu.cluster_cores:.2f} | {s.cpu.other_cores:.2f} | {s.cpu.machine_busy:.0%} |")
    bound = [s for s in steps if s.cpu.generator_bound]
    lines.append("")
    if bound:
        lines.append(f"The load generator was the limit from {bound[0].offered_rps:,.0f}/s "
                     "offered (a Locust process at >= 90 % of a core): those steps measure "
                     "Locust, not Seqlog.")
    else:
        lines.append("No Locust process reached 90 % of a core: the load generator was not "
                     "the limit.")
    if any(s.cpu.machine_bound for s in steps):
        lines.append("The machine's CPUs were saturated in some steps; generator, cluster and "
                     "any other processes (\"other cores\") share them, so those figures are a "
                     "lower bound for Seqlog alone.")
    lines += ["", "![throughput and latency against offered load](capacity.png)", ""]
    return "\n".join(lines)


def plot_capacity(path: Path, steps: list[Step], *, knee: Step | None,
                  p99_threshold_ms: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    offered = [s.offered_rps for s in steps]
    fig, throughput_ax = plt.subplots(figsize=(8, 5))
    throughput_ax.plot(offered, [s.achieved_rps for s in steps], "o-", color="tab:blue",
                       label="achieved appends/s")
    throughput_ax.plot(offered, offered, ":", color="grey", label="offered = achieved")
    throughput_ax.set_xlabel("offered load (appends/s)")
    throughput_ax.set_ylabel("achieved throughput (appends/s)")
    throughput_ax.set_xscale("log")
    throughput_ax.set_xticks(offered, labels=[f"{o:,.0f}" for o in offered])
    throughput_ax.minorticks_off()
    throughput_ax.set_ylim(bottom=0)
    latency_ax = throughput_ax.twinx()
    latency_ax.plot(offered, [s.p50_ms for s in steps], "s--", color="tab:green", label="p50 ms")
    latency_ax.plot(offered, [s.p99_ms for s in steps], "^--", color="tab:red", label="p99 ms")
    latency_ax.axhline(p99_threshold_ms, color="tab:red", alpha=0.3,
                       label=f"p99 threshold {p99_threshold_ms:g} ms")
    latency_ax.set_ylabel("append latency (ms)")
    latency_ax.set_ylim(bottom=0)
    if knee is not None:
        throughput_ax.axvline(knee.offered_rps, color="black", alpha=0.4, linestyle="-.",
                              label=f"knee {knee.offered_rps:,.0f}/s")
    handles = throughput_ax.get_legend_handles_labels()
    more = latency_ax.get_legend_handles_labels()
    throughput_ax.legend(handles[0] + more[0], handles[1] + more[1], loc="upper left",
                         fontsize="small")
    throughput_ax.set_title("Seqlog append capacity")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

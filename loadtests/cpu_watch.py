"""CPU use of the load generator and of the cluster during a Locust run (psutil, a thread).

The point is to tell who limited a run: a Locust process near 100 % of one core means the
generator, not Seqlog, was the bottleneck. Samples are taken once a second from a background
thread because the runner itself only waits for the Locust subprocess.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import psutil  # type: ignore[import-untyped]

SAMPLE_INTERVAL_S = 1.0
GENERATOR_BOUND_CORE_FRACTION = 0.9
"""A Locust process using at least this share of one core is taken as the limit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuUse:
    generator_core_max: float
    """Busiest Locust process, in cores (1.0 = one core fully busy)."""
    generator_cores: float
    """All Locust processes together, in cores."""
    cluster_cores: float
    """All Seqlog node processes together, in cores (0 when their pids are unknown)."""
    machine_busy: float
    """Share of the whole machine that was busy (0..1)."""
    cores: int

    @property
    def other_cores(self) -> float:
        """Cores busy with neither Locust nor Seqlog: other work sharing the machine."""
        return max(0.0, self.machine_busy * self.cores - self.generator_cores
                   - self.cluster_cores)

    @property
    def generator_bound(self) -> bool:
        return self.generator_core_max >= GENERATOR_BOUND_CORE_FRACTION

    @property
    def machine_bound(self) -> bool:
        return self.machine_busy >= GENERATOR_BOUND_CORE_FRACTION


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


class CpuWatch:
    """Samples the process tree of ``generator_pid`` and the ``cluster_pids`` until stopped."""

    def __init__(self, generator_pid: int, cluster_pids: list[int], *, warmup_s: float) -> None:
        # Start-up (imports, spawning) is not load: measuring begins after the warm-up.
        self._warmup_s = warmup_s
        self._generator_pid = generator_pid
        self._cluster_pids = cluster_pids
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._generator: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-watch", daemon=True)
        self._first_wall_s = 0.0
        self._last_wall_s = 0.0
        self._machine_first: tuple[float, float] | None = None
        self._machine_last: tuple[float, float] | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> CpuUse:
        self._stop.set()
        self._thread.join(timeout=SAMPLE_INTERVAL_S * 5)
        wall_s = max(self._last_wall_s - self._first_wall_s, 1e-9)

        def cores(pid: int) -> float:
            return (self._last[pid] - self._first.get(pid, self._last[pid])) / wall_s

        if not self._last:
            return CpuUse(generator_core_max=0.0, generator_cores=0.0, cluster_cores=0.0,
                          machine_busy=0.0, cores=psutil.cpu_count() or 1)
        generator = [cores(p) for p in self._generator if p in self._last]
        cluster = [cores(p) for p in self._cluster_pids if p in self._last]
        busy = 0.0
        if self._machine_first and self._machine_last:
            total_s = self._machine_last[0] - self._machine_first[0]
            idle_s = self._machine_last[1] - self._machine_first[1]
            busy = 1.0 - idle_s / total_s if total_s > 0 else 0.0
        return CpuUse(
            generator_core_max=max(generator, default=0.0), generator_cores=sum(generator),
            cluster_cores=sum(cluster), machine_busy=busy, cores=psutil.cpu_count() or 1,
        )

    def _sample(self) -> None:
        seen: dict[int, float] = {}
        try:
            root = psutil.Process(self._generator_pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            tree = []
        for process in tree:
            try:
                seen[process.pid] = _cpu_s(process)
                self._generator.add(process.pid)
            except psutil.Error:
                continue
        for pid in self._cluster_pids:
            try:
                seen[pid] = _cpu_s(psutil.Process(pid))
            except psutil.Error:
                continue
        now_s = time.monotonic()
        times = psutil.cpu_times()
        machine = (float(sum(times)), float(times.idle + getattr(times, "iowait", 0.0)))
        if not self._first_wall_s:
            self._first_wall_s = now_s
            self._machine_first = machine
        for pid, cpu_s in seen.items():
            self._first.setdefault(pid, cpu_s)
            self._last[pid] = cpu_s
        self._last_wall_s = now_s
        self._machine_last = machine

    def _run(self) -> None:
        if self._stop.wait(self._warmup_s):
            return
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(SAMPLE_INTERVAL_S)
        self._sample()

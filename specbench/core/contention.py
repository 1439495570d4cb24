"""What else the machine did during a timed stretch (Linux /proc): other processes' CPU time in cores' worth
(machine-wide busy time minus this process's own), the hypervisor's steal, the load average. The runner's noise
guard (run/noise.py) and `specbench profile` both read it.
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass
from pathlib import Path

from .timing import now

FOREIGN_CPU_LIMIT = 0.25  # cores' worth of other processes' CPU time during a timed row
STEAL_LIMIT = 0.05  # share of CPU time stolen by the hypervisor during a timed row
MIN_WALL_S = 0.2  # shorter stretches are not judged: /proc/stat counts in 10 ms ticks
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/stat unit (jiffies per second)


@dataclass(frozen=True)
class Snapshot:
    wall: float  # timing.now() s (the perf_counter clock; only differences are read)
    busy_s: float  # machine-wide CPU time spent running anything (user, nice, system, irq, softirq), s
    steal_s: float  # CPU time stolen by the hypervisor, s
    total_s: float  # all CPU time accounted, s
    own_s: float  # this process's CPU time (every thread), s
    load1: float  # 1-minute load average


def snapshot() -> Snapshot:
    """The machine's CPU accounting now (NaNs where /proc is not available)."""
    busy = steal = total = math.nan
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        user, nice, system, idle, iowait, irq, softirq, st = (fields + [0] * 8)[:8]
        busy, steal = (user + nice + system + irq + softirq) / _TICK, st / _TICK
        total = (user + nice + system + idle + iowait + irq + softirq + st) / _TICK
    except (OSError, ValueError, IndexError):
        pass
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = math.nan
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return Snapshot(now(), busy, steal, total, usage.ru_utime + usage.ru_stime, load1)


def between(before: Snapshot, after: Snapshot) -> dict:
    """Record fields for one timed stretch: foreign_cpu (cores), steal (share), load_before, load_after."""
    wall = after.wall - before.wall
    foreign = steal = math.nan
    if wall >= MIN_WALL_S and not math.isnan(before.busy_s):
        others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
        foreign = max(0.0, others) / wall  # jiffy granularity (10 ms) and accounting lag can dip below 0
        accounted = after.total_s - before.total_s
        steal = (after.steal_s - before.steal_s) / accounted if accounted > 0 else 0.0
    return {"foreign_cpu": round(foreign, 3), "steal": round(steal, 4),
            "load_before": round(before.load1, 2), "load_after": round(after.load1, 2)}


def disturbed(reading: dict) -> bool:
    """Whether one stretch ran beside more than FOREIGN_CPU_LIMIT cores of other work or STEAL_LIMIT steal."""
    return (reading.get("foreign_cpu") or 0) > FOREIGN_CPU_LIMIT or (reading.get("steal") or 0) > STEAL_LIMIT

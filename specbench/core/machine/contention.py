"""What else the machine did during a timed stretch (Linux /proc): other processes' CPU time in cores' worth
(machine-wide busy time minus this process's own), the hypervisor's steal, the load average. The runner's noise
guard (run/noise.py), `specbench profile` and the rates measured once per machine (bandwidth.py, peak.py: `beside`)
read it.

A sharded run (`run --shards N`) runs its shards side by side on purpose, each on the cores Ray gave it: their CPU
time is part of the run's plan, not a disturbance. Each of its processes files its pid in RUN/shards/ (watching_run);
their CPU time is then recorded apart (`sibling_cpu`) and left out of `foreign_cpu`.
"""

from __future__ import annotations

import math
import os
import resource
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .timing import now

FOREIGN_CPU_LIMIT = 0.25  # cores' worth of other processes' CPU time during a timed row
STEAL_LIMIT = 0.05  # share of CPU time stolen by the hypervisor during a timed row
MIN_WALL_S = 0.2  # shorter stretches are not judged: /proc/stat counts in 10 ms ticks
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/stat unit (jiffies per second)
_run_folder: Path | None = None  # RUN/shards of the sharded run this process belongs to (watching_run)


@contextmanager
def watching_run(folder: Path, name: str) -> Iterator[None]:
    """Within: this process belongs to a sharded run. Files its pid as FOLDER/NAME.pid (host and pid: a folder on
    a shared file system may list other machines' processes, which are not read) and counts the processes filed
    there as siblings. A retried shard's new worker overwrites its dead one's file."""
    global _run_folder
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.pid").write_text(f"{socket.gethostname()} {os.getpid()}\n")
    kept, _run_folder = _run_folder, folder
    try:
        yield
    finally:
        _run_folder = kept


def sibling_cpu() -> dict[int, float]:
    """pid -> CPU time (s, every thread) of this machine's other processes of the watched run; {} when none."""
    if _run_folder is None:
        return {}
    host, own, out = socket.gethostname(), os.getpid(), {}
    for path in _run_folder.glob("*.pid"):
        try:
            where, pid = path.read_text().split()
            if where != host or int(pid) == own:
                continue
            # /proc/PID/stat: "pid (comm) state ..."; after the comm, utime and stime are fields 12 and 13 (ticks)
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[int(pid)] = (int(fields[11]) + int(fields[12])) / _TICK
        except (OSError, ValueError, IndexError):  # gone, being rewritten, or not Linux
            continue
    return out


@dataclass(frozen=True)
class Snapshot:
    wall: float  # timing.now() s (the perf_counter clock; only differences are read)
    busy_s: float  # machine-wide CPU time spent running anything (user, nice, system, irq, softirq), s
    steal_s: float  # CPU time stolen by the hypervisor, s
    total_s: float  # all CPU time accounted, s
    own_s: float  # this process's CPU time (every thread), s
    load1: float  # 1-minute load average
    siblings: dict = field(default_factory=dict)  # pid -> CPU time (s) of the sharded run's other processes


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
    return Snapshot(now(), busy, steal, total, usage.ru_utime + usage.ru_stime, load1, sibling_cpu())


def between(before: Snapshot, after: Snapshot) -> dict:
    """Record fields for one timed stretch: foreign_cpu (cores), steal (share), load_before, load_after, and in a
    sharded run sibling_cpu (cores)."""
    wall = after.wall - before.wall
    foreign = steal = math.nan
    # a sibling that started or ended within the stretch is left out: its CPU time is only known at one end
    both = before.siblings.keys() & after.siblings.keys()
    siblings = sum(max(0.0, after.siblings[p] - before.siblings[p]) for p in both)
    if wall >= MIN_WALL_S and not math.isnan(before.busy_s):
        others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s) - siblings
        foreign = max(0.0, others) / wall  # jiffy granularity (10 ms) and accounting lag can dip below 0
        accounted = after.total_s - before.total_s
        steal = (after.steal_s - before.steal_s) / accounted if accounted > 0 else 0.0
    reading = {"foreign_cpu": round(foreign, 3), "steal": round(steal, 4),
               "load_before": round(before.load1, 2), "load_after": round(after.load1, 2)}
    if _run_folder is not None:
        reading["sibling_cpu"] = round(siblings / wall, 3) if wall >= MIN_WALL_S else math.nan
    return reading


def disturbed(reading: dict) -> bool:
    """Whether one stretch ran beside more than FOREIGN_CPU_LIMIT cores of other work or STEAL_LIMIT steal."""
    return (reading.get("foreign_cpu") or 0) > FOREIGN_CPU_LIMIT or (reading.get("steal") or 0) > STEAL_LIMIT


def beside(fn):
    """(fn(), the reading of what else ran meanwhile): for a rate measured once per machine and cached, which must not
    be cached from a measurement beside other work (it would stand for this machine in every later run)."""
    before = snapshot()
    out = fn()
    return out, between(before, snapshot())


def not_cached_note(reading: dict) -> str:
    """The source line of a rate measured beside other work: used this once, never cached."""
    return (f"measured now beside {reading.get('foreign_cpu', math.nan):.2f} cores of other work (steal "
            f"{reading.get('steal', math.nan):.0%}): used this once, not cached")

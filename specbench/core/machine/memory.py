"""Peak memory of one generation (docs/measurement.md): allocated memory on CUDA, resident set size (RSS) on CPU.

On CPU the process's all-time peak RSS (ru_maxrss) only grows, so it would charge a method with whatever ran
before it. On Linux, writing "5" to /proc/self/clear_refs resets the peak RSS counter (VmHWM in /proc/self/status)
to the current RSS: reset_peak before a generation, peak_mb after it gives that generation's own peak.
Where the reset is unavailable, peak_mb falls back to ru_maxrss, and peak_label says so.
"""

from __future__ import annotations

import re
import resource
import sys
from functools import lru_cache
from pathlib import Path

import torch

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")
PROBE_MB = 64  # allocated once to check that the reset works


def _hwm_mb() -> float | None:
    """VmHWM (peak RSS since the last reset) in MiB, or None where /proc has none."""
    try:
        found = re.search(r"^VmHWM:\s+(\d+) kB", STATUS.read_text(), re.M)
    except OSError:
        return None
    return int(found.group(1)) / 1024 if found else None


def _clear_hwm() -> bool:
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


@lru_cache(maxsize=1)
def cpu_reset_works() -> bool:
    """Whether resetting VmHWM works here: a freed probe allocation no longer counts after a reset."""
    probe = bytearray(PROBE_MB * 2**20)  # zero-filled: every page resident
    del probe
    before = _hwm_mb()
    if before is None or not _clear_hwm():
        return False
    after = _hwm_mb()
    return after is not None and after < before - PROBE_MB / 2


def reset_peak(device: torch.device) -> None:
    """Start measuring a new peak (call before a generation)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif cpu_reset_works():
        _clear_hwm()


def _max_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


def peak_mb(device: torch.device) -> float:
    """MiB at the peak since reset_peak: allocated on CUDA, RSS on CPU (process peak where the reset fails)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if cpu_reset_works():
        return _hwm_mb()
    return _max_rss_mb()


def peak_label(device: torch.device) -> str:
    """What peak_mb measures on this device, for reports and run.yaml."""
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated during the generation"
    if cpu_reset_works():
        return "peak RSS during the generation (VmHWM, reset before it)"
    return "peak RSS of the whole process so far (ru_maxrss; no per-generation reset here): includes earlier runs"


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (what a new allocation can take without swapping), or None off Linux."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None

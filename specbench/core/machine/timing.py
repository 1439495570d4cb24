"""The one timing facility: every duration specbench reports or decides by is read here.

- `now(device)`: perf_counter after waiting for `device`'s queued work, so a difference of two readings covers the
  device work in between (runs, PEARL's busy spans, training and estimate durations).
- `wall(device, out)`: a block timed with synchronisation at its two boundaries only (a whole generation).
- `call_ms(fn, device)`: milliseconds of one call, with CUDA events on the device's current stream on a GPU (no
  host-side synchronisation inside the timed span) and perf_counter on a CPU (single forwards: latency profiles,
  calibration, the drafter's forward cost).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager

import torch


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued device work so a wall-clock reading covers it (nothing to wait for on a CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device | str | None = None) -> float:
    """Seconds on the perf_counter clock, after `device`'s queued work finished."""
    synchronize(device)
    return time.perf_counter()


def since(start: float, device: torch.device | str | None = None) -> float:
    """Seconds from `start` (a `now()` reading) to now."""
    return now(device) - start


@contextmanager
def wall(device: torch.device | str, out: dict):
    """Time a block with device synchronisation at its boundaries; stores seconds in out['s']."""
    start = now(device)
    try:
        yield out
    finally:
        out["s"] = since(start, device)


def call_ms(fn: Callable[[], object], device: torch.device | str) -> float:
    """Milliseconds of one call of `fn`. On a GPU: CUDA events on the stream the work is queued on, `device`'s
    current one (not the current device's, which differs for a drafter on a second GPU; inside a --pearl-exec
    streams job it is that job's stream), read after the device finished."""
    device = torch.device(device)
    if device.type == "cuda":
        stream = torch.cuda.current_stream(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        fn()
        end.record(stream)
        torch.cuda.synchronize(device)
        return start.elapsed_time(end)
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def median_call_ms(fn: Callable[[], object], device: torch.device | str, repeats: int = 20, warmup: int = 3,
                   reset: Callable[[], object] | None = None) -> float:
    """Median milliseconds of `repeats` calls of `fn` after `warmup` untimed ones (first-use costs); `reset` runs
    untimed after each call (e.g. crop a cache back)."""
    times = []
    for _ in range(warmup + repeats):
        times.append(call_ms(fn, device))
        if reset is not None:
            reset()
    timed = sorted(times[warmup:])
    return round(timed[len(timed) // 2], 3)

"""One timer for every method: perf_counter after a device synchronisation (CPU and GPU alike), with named phases.
(Single forwards, for latency profiles and calibration, are timed with CUDA events on GPU: forward.timed_forward.)"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait for queued device work so a wall-clock reading covers it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class PhaseTimer:
    """Accumulates seconds per named phase.

    Phases are timed with perf_counter after a device synchronisation at both ends when `sync` is set. Phase
    timing is diagnostic (it adds synchronisations); the headline wall time comes from `wall()` around a whole
    generation, which synchronises only at its boundaries.
    """

    def __init__(self, device: torch.device | str = "cpu", sync_phases: bool = False):
        self.device = torch.device(device)
        self.sync_phases = sync_phases
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str):
        if self.sync_phases:
            synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync_phases:
                synchronize(self.device)
            self.seconds[name] += time.perf_counter() - start


@contextmanager
def wall(device: torch.device | str, out: dict):
    """Time a block with device synchronisation at its boundaries; stores seconds in out['s']."""
    synchronize(device)
    start = time.perf_counter()
    try:
        yield out
    finally:
        synchronize(device)
        out["s"] = time.perf_counter() - start

"""The memory bandwidth beside each timed turn: what a turn's share of the roofline divides by (records.csv's
`bandwidth_gb_s`; report/roofline.py).

A shared VM's bandwidth moves while a run runs: on the AMX Xeon kind it read 26.8 GB/s before a run's turns and 35.8
after them, two minutes later, and a pass over a forward's weights streamed anywhere from 16 to 32 GB/s within one
second (benchmarks/RESULTS-cpu.md, stop 63). One reading before the turns and one after cannot say which of the two a
turn ran at, so every timed turn is bracketed by two short readings (core/machine/bandwidth.probe: best of 2 reads
of a buffer twice the last-level cache), untimed, and the turn's bandwidth is their mean. The reading after a turn
is the one before the next, when the next starts within REUSE_S (the lossless check and the record between them take
milliseconds), so a run pays one probe (~0.2 s) per turn.

Only where the roofline is a CPU's and the run owns the machine: not on a GPU (its bandwidth holds steady, and the
buffer would take device memory), not with $SPECBENCH_BANDWIDTH_GB_S (a given bandwidth), not in a sharded run or
under --tp (several processes share the memory bus, and one's probe would slow the others' timed turns).
"""

from __future__ import annotations

import math
import os
import time

import torch

from ..core.machine import bandwidth

REUSE_S = 1.0  # a reading this recent still stands for the next turn's start


class TurnBandwidth:
    """Readings around timed turns: `before()` when a turn starts, `beside(reading)` when it ends (its mean)."""

    def __init__(self, device: torch.device | str | None):
        """`device`: the backend's roofline device (OwnMethods.bandwidth_device), None where it reads none."""
        self.device = torch.device(device) if device is not None else None
        self.enabled = self.device is not None and self.device.type == "cpu" and not os.environ.get(bandwidth.ENV)
        self._last: tuple[float, float] | None = None  # (GB/s, perf_counter when it was taken)

    def _read(self) -> float:
        gb_s = bandwidth.probe(self.device)
        self._last = (gb_s, time.perf_counter())
        return gb_s

    def before(self) -> float:
        """The reading a turn starts at: the last one when it is recent, else one taken now (NaN when off)."""
        if not self.enabled:
            return math.nan
        if self._last is not None and time.perf_counter() - self._last[1] <= REUSE_S:
            return self._last[0]
        return self._read()

    def beside(self, before: float) -> float:
        """The turn's bandwidth: the mean of `before` and a reading taken now, GB/s (NaN when off)."""
        if not self.enabled or not math.isfinite(before):
            return math.nan
        return round((before + self._read()) / 2, 2)

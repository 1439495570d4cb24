"""This machine's memory bandwidth: what bounds a decoding forward that reads every weight once (report/roofline.py).

Measured as timed passes over buffers far larger than the last-level cache, best of a few:
- copy: dst.copy_(src), counted as 2 x the buffer's bytes moved (read + write, STREAM's convention);
- read: src.sum(), counted as the buffer's bytes read (what a forward does to its weights);
- kernel (CPU, where specbench's native library is built): a one-row linear through the panels kernel
  (core/model/panel_linear.py) with src as its weight, the read a compiled decode forward does. It streamed faster
  than sum() here (47-48 against 42-45 GB/s on a Zen 5 EPYC), and a compiled `ar` decoded faster than a roofline
  from sum()'s reading allowed (benchmarks/RESULTS-cpu.md, stop 59).
The largest is the bandwidth the roofline uses: a bound must not be beatable, and on CPUs a copy's write
allocation makes it move more bytes than it is credited with, so it can read lower than the reads a forward does.

Each buffer is max(512 MiB, 2 x the last-level cache) on a CPU (both buffers together: at least 1 GiB and 4 x the
LLC, so nearly every byte misses the cache), capped at a quarter of the available memory, and 1 GiB on a GPU
(timed with CUDA events, after one untimed pass that faults the pages in).

The result is cached per hardware key (core/machine/hardware.hardware_slug) in the user cache:
<user cache>/bandwidth/<hardware key>.yaml, with the thread count it was measured with; a different thread count
measures again (on a CPU the bandwidth a process reaches depends on the cores it uses).
A benchmark run's roofline does not read that cache: a machine's bandwidth can move by a third within a day, so a run
measures it in its own sitting, before its turns (`for_run`), and falls back to the cached reading, saying so, only
when other work disturbed that measurement. On a CPU a run also reads it beside every timed turn (`probe`, a short
reading: run/turn_bandwidth.py).
$SPECBENCH_BANDWIDTH_GB_S, when set, is taken instead of any measurement (its source says so).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import yaml

from .. import store
from . import contention
from .memory import available_bytes
from .given_rate import positive_rate

MiB = 2**20
CPU_FLOOR = 512 * MiB  # per buffer, whatever the cache
GPU_BYTES = 2**30
REPEATS = 5
ENV = "SPECBENCH_BANDWIDTH_GB_S"  # a known bandwidth: nothing measured (_given)


@dataclass(frozen=True)
class Bandwidth:
    """One measurement: GB/s (1e9 bytes per second) of the copy, the read, the kernel read and the one used (the
    largest)."""

    gb_s: float  # max(copy_gb_s, read_gb_s, kernel_gb_s): what the roofline divides by
    copy_gb_s: float
    read_gb_s: float
    buffer_bytes: int  # one buffer's size
    repeats: int
    device: str  # the device type measured: cpu or cuda
    threads: int  # torch threads at the time (CPU)
    hardware: str  # the hardware key
    measured_at: str  # UTC, ISO 8601
    kernel_gb_s: float = 0.0  # the panels kernel's read (0: not measured: no native library, a GPU, an old cache)
    source: str = "measured now"  # or "cached <path>": filled when read back, not stored

    def stored(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "source"}


def cache_file(hardware: str) -> Path:
    """<user cache>/bandwidth/<hardware key>.yaml."""
    return store.user_cache() / "bandwidth" / f"{hardware}.yaml"


def last_level_cache_bytes() -> int:
    """The largest CPU cache /sys reports (the LLC), in bytes; 0 where /sys says nothing."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            sizes.append(parse_size(f.read_text()))
        except (OSError, ValueError):
            continue
    return max(sizes, default=0)


def parse_size(text: str) -> int:
    """/sys's cache size ('491520K', '2M', '32768') -> bytes."""
    text = text.strip().upper()
    unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * unit


def cpu_buffer_bytes(llc: int, available: int | None) -> int:
    """One buffer's bytes on a CPU: max(512 MiB, 2 x LLC), at most a quarter of the available memory (two buffers
    then take half of it), rounded down to whole MiB."""
    size = max(CPU_FLOOR, 2 * llc)
    if available:
        size = min(size, available // 4)
    return max(size // MiB, 1) * MiB


def rates(buffer_bytes: int, copy_s: list[float], read_s: list[float]) -> tuple[float, float]:
    """(copy GB/s, read GB/s) of the best timings: a copy moves 2 x buffer_bytes, a read buffer_bytes."""
    return 2 * buffer_bytes / min(copy_s) / 1e9, buffer_bytes / min(read_s) / 1e9


def _timed(fn, device: torch.device) -> float:
    """Seconds of one call: CUDA events on a GPU (one sync after), perf_counter on a CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        stream = torch.cuda.current_stream(device)  # the device's own stream, whichever GPU is current
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _kernel_read(src: torch.Tensor):
    """A call that reads all of `src` (1-D float32) as the panels kernel reads a weight (a one-row linear, src as
    panels [P, 1024, 16]), and the bytes it reads; None where that kernel does not run here (no native library)."""
    from ..model import panel_linear  # (not at import: the model layer builds on this one)

    k = 1024
    panels = src.numel() // (16 * k)
    if src.device.type != "cpu" or not panels or not panel_linear.available(torch.float32):
        return None
    weight = src[:panels * 16 * k].view(panels, k, 16)
    x = torch.ones(1, k)
    return (lambda: panel_linear.linear(x, weight, panels * 16, None)), weight.numel() * 4


def _time_reads(src: torch.Tensor, kernel, device: torch.device, read_s: list, kernel_s: list) -> None:
    """One timed sum() of `src` and one timed kernel read of it (`kernel`: _kernel_read's, or None), appended."""
    read_s.append(_timed(lambda: src.sum(), device))
    if kernel:
        kernel_s.append(_timed(kernel[0], device))


def measure(device: torch.device, hardware: str, repeats: int = REPEATS, buffer_bytes: int | None = None) -> Bandwidth:
    """Time `repeats` copies and reads of a buffer far larger than the caches on `device` (best of each)."""
    if buffer_bytes is None:
        buffer_bytes = GPU_BYTES if device.type == "cuda" else cpu_buffer_bytes(last_level_cache_bytes(),
                                                                                 available_bytes())
    n = buffer_bytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)  # ones: every page written, so really resident
    dst = torch.empty_like(src)
    dst.copy_(src)  # untimed: faults dst's pages in
    copy_s, read_s, kernel_s = [], [], []
    kernel = _kernel_read(src)
    with torch.inference_mode():
        for _ in range(repeats):
            copy_s.append(_timed(lambda: dst.copy_(src), device))
            _time_reads(src, kernel, device, read_s, kernel_s)
    del src, dst
    copy, read = rates(buffer_bytes, copy_s, read_s)
    through = kernel[1] / min(kernel_s) / 1e9 if kernel else 0.0
    return Bandwidth(round(max(copy, read, through), 2), round(copy, 2), round(read, 2), buffer_bytes, repeats,
                     device.type, torch.get_num_threads(), hardware,
                     time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), round(through, 2))


PROBE_REPEATS = 2  # reads of one probe (probe()): best of 2, ~0.2 s with the buffer's allocation on a CPU


def probe(device: torch.device) -> float:
    """A short reading of the bandwidth a timed turn sees (run/turn_bandwidth.py), GB/s: a fresh buffer of
    measure()'s size, read PROBE_REPEATS times as measure() reads it (the panels kernel's one-row read and sum(); the
    best of each, the larger), then freed again, so that no turn's peak memory holds it. CPU only: 0.0 elsewhere."""
    device = torch.device(device)
    if device.type != "cpu":
        return 0.0
    buffer_bytes = cpu_buffer_bytes(last_level_cache_bytes(), available_bytes())
    src = torch.ones(buffer_bytes // 4, dtype=torch.float32)
    kernel = _kernel_read(src)
    read_s, kernel_s = [], []
    with torch.inference_mode():
        for _ in range(PROBE_REPEATS):
            _time_reads(src, kernel, device, read_s, kernel_s)
    del src
    best = max(buffer_bytes / min(read_s), kernel[1] / min(kernel_s) if kernel else 0.0)
    return round(best / 1e9, 2)


def read_cached(hardware: str, device_type: str, threads: int) -> Bandwidth | None:
    """The cached measurement of this hardware key, or None (none, unreadable, or another device type or thread
    count)."""
    path = cache_file(hardware)
    try:
        data = yaml.safe_load(path.read_text())
        found = Bandwidth(**data, source=f"cached {path}")
    except (OSError, yaml.YAMLError, TypeError):
        return None
    if found.device != device_type or (device_type == "cpu" and found.threads != threads) or found.gb_s <= 0:
        return None
    return found


def write_cached(bw: Bandwidth) -> Path:
    path = cache_file(bw.hardware)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(bw.stored(), sort_keys=False))
    return path


def bandwidth(device: torch.device, remeasure: bool = False) -> Bandwidth:
    """This device's memory bandwidth: the cached measurement of its hardware key, else measured now and cached
    (cached only when nothing else ran beside the measurement)."""
    from .hardware import hardware_slug

    device = torch.device(device)
    hardware = hardware_slug(device)
    given = os.environ.get(ENV)
    if given:
        return _given(given, device, hardware)
    if not remeasure:
        cached = read_cached(hardware, device.type, torch.get_num_threads())
        if cached is not None:
            return cached
    found, reading = contention.beside(lambda: measure(device, hardware))
    if contention.disturbed(reading):  # other work shared the memory bus: a low figure, fine for now, not for later
        return replace(found, source=contention.not_cached_note(reading))
    write_cached(found)
    return found


def for_run(device: torch.device, moment: str = "before this run's turns") -> Bandwidth:
    """The bandwidth a run's roofline divides by: measured now, in the run's own sitting (and cached for the commands
    that read the cache); when other work disturbed the measurement (it reads low), the cached reading with both
    said, or the disturbed one where nothing is cached. `moment` says when, in the source."""
    from .hardware import hardware_slug

    device = torch.device(device)
    hardware = hardware_slug(device)
    given = os.environ.get(ENV)
    if given:
        return _given(given, device, hardware)
    found, reading = contention.beside(lambda: measure(device, hardware))
    if not contention.disturbed(reading):
        write_cached(found)
        return replace(found, source=f"measured now, {moment}")
    cached = read_cached(hardware, device.type, torch.get_num_threads())
    if cached is None:
        return replace(found, source=contention.not_cached_note(reading))
    return replace(cached, source=f"{cached.source} (a measurement {moment} read {found.gb_s:.1f} GB/s "
                                  f"beside {reading.get('foreign_cpu', math.nan):.2f} cores of other work: not used)")


def _given(text: str, device: torch.device, hardware: str) -> Bandwidth:
    """A bandwidth set by $SPECBENCH_BANDWIDTH_GB_S (GB/s): nothing is measured."""
    gb_s = positive_rate(ENV, text, "a bandwidth", "GB/s", "48.5")
    return Bandwidth(gb_s, math.nan, math.nan, 0, 0, device.type, torch.get_num_threads(), hardware, "",
                     source=f"${ENV}")


def describe(bw: Bandwidth) -> str:
    """One line: '9.1 GB/s (copy 8.8, read 9.1[, kernel read 9.3]; 960 MiB buffers, best of 5, 2 threads; measured
    now)'."""
    if not bw.repeats:
        return f"{bw.gb_s:.1f} GB/s (given: {bw.source})"
    kernel = f", kernel read {bw.kernel_gb_s:.1f}" if bw.kernel_gb_s else ""
    return (f"{bw.gb_s:.1f} GB/s (copy {bw.copy_gb_s:.1f}, read {bw.read_gb_s:.1f}{kernel}; "
            f"{bw.buffer_bytes // MiB} MiB buffers, best of {bw.repeats}, {bw.threads} threads; {bw.source}, "
            f"{bw.measured_at})")

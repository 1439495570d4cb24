"""This machine's arithmetic peak at a dtype: what bounds a forward wide enough to be compute-bound
(core/machine/ideal.py).

Measured two ways, best of a few after an untimed call (the library's own warm-up: thread pools, packing buffers),
and the larger taken:
- a timed square GEMM (torch.mm of two n x n matrices of the dtype; 2 n^3 floating-point operations) large enough to
  run at the library's best rate and small enough to take a fraction of a second: n = 2048 on a CPU, 8192 on a GPU
  (CUDA events);
- on a CPU in float32 and bfloat16, where the native library is built, specbench's own panels linear
  (core/model/panel_linear.py) over a weight of the dtype that stays in the caches, 112 rows: what a compiled
  forward's linears reach here. On a Zen 5 EPYC torch's float32 GEMM ran at 224 GFLOP/s and the panels at 490-510
  (stop 60): a peak from the GEMM alone was one a forward beat (a compiled L(16) read 0.96 of its "ideal").

Cached like the bandwidth (core/machine/bandwidth.py), per hardware key and dtype: <user cache>/peak/<hardware key>
-<dtype>.yaml, with the thread count (a different count measures again; so does a cache written before the panels
probe, where it runs). $SPECBENCH_PEAK_GFLOPS, when set (GFLOP/s), is taken instead of any measurement, at every
dtype (its source says so).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import yaml

from .. import store
from . import contention
from .given_rate import positive_rate

ENV = "SPECBENCH_PEAK_GFLOPS"  # a known peak: nothing measured (_given)
REPEATS = 5
CPU_SIZE, GPU_SIZE = 2048, 8192  # the GEMM's n


@dataclass(frozen=True)
class Peak:
    """One measurement: GFLOP/s (1e9 floating-point operations a second) at `dtype`, max(GEMM, panels)."""

    gflops: float
    dtype: str  # float32, bfloat16, float16
    size: int  # the GEMM's n (0: given)
    repeats: int
    device: str  # cpu or cuda
    threads: int  # torch threads at the time (CPU)
    hardware: str  # the hardware key
    measured_at: str  # UTC, ISO 8601
    gemm_gflops: float = 0.0  # the n x n x n GEMM's rate (0: given, or a cache from before both were kept)
    kernel_gflops: float = 0.0  # the panels linear's rate (0: not measured: not a CPU, another dtype, no native lib)
    source: str = "measured now"  # or "cached <path>", "$SPECBENCH_PEAK_GFLOPS": filled when read, not stored

    def stored(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "source"}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cache_file(hardware: str, dtype: torch.dtype) -> Path:
    """<user cache>/peak/<hardware key>-<dtype>.yaml."""
    return store.user_cache() / "peak" / f"{hardware}-{dtype_name(dtype)}.yaml"


def gemm_gflops(size: int, seconds: float) -> float:
    """GFLOP/s of an n x n x n GEMM (2 n^3 operations: a multiply and an add per term) done in `seconds`."""
    return 2 * size**3 / seconds / 1e9


def _kernel_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the panels linear runs here at `dtype` (a CPU, float32 or bfloat16, the native library built)."""
    from ..model import panel_linear  # (not at import: the model layer builds on this one)

    return device.type == "cpu" and panel_linear.available(dtype)


def _kernel_call(device: torch.device, dtype: torch.dtype):
    """A panels linear of 112 rows over a 384 x 576 weight of `dtype` (0.9 MB in float32: it stays in the caches)
    and its FLOPs; None where that kernel does not run (a GPU, another dtype, no native library)."""
    from ..model import panel_linear

    if not _kernel_runs(device, dtype):
        return None
    gen = torch.Generator().manual_seed(0)
    n, k, rows = 384, 576, 112
    packed = panel_linear.pack(torch.randn(n, k, generator=gen).to(dtype))
    x = torch.randn(rows, k, generator=gen).to(dtype)
    return (lambda: panel_linear.linear(x, packed, n, None)), 2.0 * n * k * rows


def measure(device: torch.device, dtype: torch.dtype, hardware: str, repeats: int = REPEATS,
            size: int | None = None) -> Peak:
    """Time `repeats` GEMMs of two size x size matrices of `dtype` on `device`, and the panels linear where it runs
    (best of each; the larger rate is the peak)."""
    from .bandwidth import _timed

    size = size or (GPU_SIZE if device.type == "cuda" else CPU_SIZE)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    kernel = _kernel_call(device, dtype)
    with torch.inference_mode():
        torch.mm(a, b)  # untimed: the library's warm-up
        gemm = gemm_gflops(size, min(_timed(lambda: torch.mm(a, b), device) for _ in range(repeats)))
        through = 0.0
        if kernel:
            kernel[0]()
            through = kernel[1] / min(_timed(kernel[0], device) for _ in range(4 * repeats)) / 1e9
    return Peak(round(max(gemm, through), 3), dtype_name(dtype), size, repeats, device.type, torch.get_num_threads(),
                hardware, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), round(gemm, 3), round(through, 3))


def read_cached(hardware: str, dtype: torch.dtype, device_type: str, threads: int) -> Peak | None:
    """The cached measurement of this hardware key and dtype, or None (none, unreadable, another device type or
    thread count)."""
    path = cache_file(hardware, dtype)
    try:
        found = Peak(**yaml.safe_load(path.read_text()), source=f"cached {path}")
    except (OSError, yaml.YAMLError, TypeError):
        return None
    if found.device != device_type or (device_type == "cpu" and found.threads != threads) or found.gflops <= 0:
        return None
    if not found.kernel_gflops and _kernel_runs(torch.device(device_type), dtype):
        return None  # measured before the panels probe, where it runs now: measure again
    return found


def write_cached(found: Peak) -> Path:
    path = cache_file(found.hardware, getattr(torch, found.dtype))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(found.stored(), sort_keys=False))
    return path


def peak(device: torch.device, dtype: torch.dtype, remeasure: bool = False) -> Peak:
    """This device's GEMM peak at `dtype`: $SPECBENCH_PEAK_GFLOPS, else the cached measurement of its hardware key,
    else measured now and cached (cached only when nothing else ran beside the measurement)."""
    from .hardware import hardware_slug

    device = torch.device(device)
    hardware = hardware_slug(device)
    given = os.environ.get(ENV)
    if given:
        return _given(given, device, dtype, hardware)
    if not remeasure:
        cached = read_cached(hardware, dtype, device.type, torch.get_num_threads())
        if cached is not None:
            return cached
    found, reading = contention.beside(lambda: measure(device, dtype, hardware))
    if contention.disturbed(reading):  # other work shared the cores: a low figure, fine for now, not for later
        return replace(found, source=contention.not_cached_note(reading))
    write_cached(found)
    return found


def _given(text: str, device: torch.device, dtype: torch.dtype, hardware: str) -> Peak:
    gflops = positive_rate(ENV, text, "a peak", "GFLOP/s", "150")
    return Peak(gflops, dtype_name(dtype), 0, 0, device.type, torch.get_num_threads(), hardware, "",
                source=f"${ENV}")


def describe(found: Peak) -> str:
    """One line: '501.2 GFLOP/s float32 (2048^3 GEMM 224.1, panels linear 501.2; best of 5, 2 threads; measured
    now, <when>)'."""
    if not found.repeats:
        return f"{found.gflops:.1f} GFLOP/s {found.dtype} (given: {found.source})"
    kernel = f", panels linear {found.kernel_gflops:.1f}" if found.kernel_gflops else ""
    return (f"{found.gflops:.1f} GFLOP/s {found.dtype} ({found.size}^3 GEMM {found.gemm_gflops:.1f}{kernel}; best of "
            f"{found.repeats}, {found.threads} threads; {found.source}, {found.measured_at})")

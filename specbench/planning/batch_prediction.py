"""`specbench map`'s cost model for one grid point: the decode throughput of B samples decoded together, each step
verifying w new tokens per sample and emitting tau of them, from this hardware's L(B, w) (`specbench profile
--batch-size`) and the step's drafting cost:

    tok/s(B) = B * tau * 1000 / (L(B, w, kv) + drafting ms per step)

`ar` is the case w = tau = 1 with no drafting, so a method's predicted speedup at B is its tok/s(B) over ar's. The
break-even batch size is where that speedup falls through 1, interpolated on log2(B) between the two grid points
around the crossing (speedup falls about linearly in log2(B) once verify cost grows with B x w).

Left out of the model, and so where a measurement can differ from it: host work per step, samples finishing at
different steps (a batch runs as long as its longest sample), and rows of unequal width in one forward (L(B, w) is
timed with every row w wide; the mean width stands in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.profile_file import LatencyProfile


@dataclass(frozen=True)
class StepShape:
    """One method's decode step at one batch size, averaged over the run's steps."""

    batch_size: int
    width: float  # new tokens per sample a verify forward reads (1 for ar; 1 + drafts for a chain; tree size)
    tau: float  # tokens each sample emits per step
    draft_ms: float = 0.0  # drafting per step (a drafter's forwards, heads), ms
    kv: int | None = None  # KV length per sample the step reads (None: the profile's shortest curve)


def step_ms(profile: LatencyProfile, shape: StepShape) -> float | None:
    """L(B, w, kv) + drafting ms, or None when the profile has no curve at this batch size."""
    view = profile.at_batch(shape.batch_size)
    if view is None:
        return None
    return view.latency_ms(max(shape.width, 1.0), shape.kv) + shape.draft_ms


def predicted_tok_s(profile: LatencyProfile, shape: StepShape) -> float | None:
    """Predicted decode tokens/s of the whole batch (B * tau per step), None without L(B, w)."""
    ms = step_ms(profile, shape)
    if ms is None or ms <= 0 or not math.isfinite(shape.tau):
        return None
    return shape.batch_size * shape.tau * 1000.0 / ms


@dataclass(frozen=True)
class BreakEven:
    """Where a method stops beating ar over a grid of batch sizes (or server concurrencies)."""

    value: float | None  # the interpolated batch size of the crossing; None when the speedup never crosses 1
    text: str  # "B~5.3", "pays at every B up to 16", "never pays (0.94x at B=1)", "-" (no points)


def break_even(points: list[tuple[int, float]], axis: str = "B") -> BreakEven:
    """The first fall of speedup through 1 going up the grid. `points`: (grid value, speedup) in any order; NaN
    speedups are skipped."""
    pts = sorted((b, s) for b, s in points if s is not None and math.isfinite(s))
    if not pts:
        return BreakEven(None, "-")
    if pts[0][1] < 1.0:
        return BreakEven(None, f"never pays ({pts[0][1]:.2f}x at {axis}={pts[0][0]})")
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        if s0 >= 1.0 > s1:
            x0, x1 = math.log2(b0), math.log2(b1)
            x = x0 + (x1 - x0) * (s0 - 1.0) / (s0 - s1)
            value = 2.0 ** x
            return BreakEven(value, f"{axis}~{value:.1f}")
    return BreakEven(None, f"pays at every {axis} up to {pts[-1][0]}")

"""`specbench map`'s cost model for one grid point: the decode throughput of B samples decoded together, each step
verifying w new tokens per sample and emitting 1 + (accepted drafts) of them, from this hardware's L(B, w) and the
step's drafting cost.

A batch lasts as long as its longest sample, and the rows of its forwards thin out as samples finish (the unpadded
engine drops a finished row), so a batch of samples that must each decode n_i tokens takes

    time = sum over steps s of (L(active_s, w, kv) + drafting ms per step)

where the number of steps is the expected maximum over the batch's samples and active_s the expected number of
samples still decoding at step s, both from a seeded simulation of each sample's accepted lengths drawn from the
per-position acceptance rates (simulate_batch). L(b, w) between two profiled batch sizes is interpolated linearly
in b. With one constant tau instead of rates, every sample takes n_i / tau steps at B rows (the mean: what
predicted_tok_s prices).

`ar` is the case w = 1 with no drafts, so a method's predicted speedup at B is its tok/s over ar's. The break-even
batch size is where that speedup falls through 1, interpolated on log2(B) between the two grid points around the
crossing (speedup falls about linearly in log2(B) once verify cost grows with B x w).

The host work of a step outside the forward (the loop's bookkeeping, a training-free method's lookup) is priced per
active row, as batch 1 measured it. Left out of the model, and so where a measurement can differ from it: host work
that grows otherwise with the batch, acceptance that differs between samples more than independent draws from one
set of rates do (a repetitive prompt accepts more at every step), and rows of unequal width in one forward (the
mean width stands in).
"""

from __future__ import annotations

import math
import random
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


def chain_rates(accepted: list[int], steps: int) -> list[float]:
    """Per-position rates of a chain over every decode step: rate i = P(draft i accepted | draft i - 1 accepted),
    with position 0 "accepted" at every step. `accepted[i]`: the steps that accepted position i + 1 (a run's
    accepted_per_position numerators), `steps`: all decode steps, drafting or not (a step that drafted nothing
    accepts nothing). The expected tau of the rates is 1 + sum(accepted) / steps, the run's own. Trailing zero rates
    are dropped."""
    rates: list[float] = []
    before = steps
    for count in accepted:
        if before <= 0:
            break
        rates.append(min(1.0, max(0.0, count / before)))
        before = count
    while rates and rates[-1] == 0.0:
        rates.pop()
    return rates


@dataclass(frozen=True)
class SimulatedBatch:
    """Steps of one batch: `steps` the expected maximum over its samples (how long the batch runs), `sample_steps`
    the expected steps of one sample (the mean over the batch), `running[s]` the chance the batch still runs at
    step s (its sum is `steps`) and `active[s]` the expected samples still decoding at step s when it does (both
    None: every row stays to the end, the constant-tau model); `rows` the batch's samples."""

    steps: float
    sample_steps: float
    active: list[float] | None
    running: list[float] | None
    rows: int


def _accepted_length(rates: list[float], rng: random.Random) -> int:
    n = 0
    for rate in rates:
        if rng.random() >= rate:
            break
        n += 1
    return n


def simulate_batch(rates: list[float] | None, lengths: list[int], tau: float = 1.0, trials: int = 200,
                   seed: int = 0) -> SimulatedBatch:
    """The steps of a batch whose samples must decode `lengths` tokens each, every step emitting 1 + an accepted
    length drawn (seeded) from the per-position `rates` (chain_rates); a step emits at most what its sample has left.
    rates None: no per-position rates, each sample takes n / tau steps, all rows to the end."""
    lengths = [max(0, int(n)) for n in lengths]
    if not lengths:
        return SimulatedBatch(0.0, 0.0, [], [], 0)
    if rates is None:
        tau = tau if tau > 0 and math.isfinite(tau) else 1.0
        return SimulatedBatch(max(lengths) / tau, sum(lengths) / len(lengths) / tau, None, None, len(lengths))
    rng = random.Random(seed)
    longest = mean = 0.0
    active: list[float] = []  # samples decoding at step s, summed over the trials that reach step s
    running: list[int] = []  # trials that reach step s
    for _ in range(trials):
        counts = []
        for n in lengths:
            left, steps = n, 0
            while left > 0:
                left -= 1 + _accepted_length(rates, rng)
                steps += 1
            counts.append(steps)
        longest += max(counts)
        mean += sum(counts) / len(counts)
        if len(active) < max(counts):
            active.extend([0.0] * (max(counts) - len(active)))
            running.extend([0] * (max(counts) - len(running)))
        for s in range(max(counts)):
            running[s] += 1
        for c in counts:
            for s in range(c):
                active[s] += 1
    return SimulatedBatch(longest / trials, mean / trials, [a / r for a, r in zip(active, running)],
                          [r / trials for r in running], len(lengths))


def expected_max_steps(rates: list[float], lengths: list[int], trials: int = 200, seed: int = 0) -> float:
    """How many steps a batch of samples decoding `lengths` tokens each runs: the expected maximum over them."""
    return simulate_batch(rates, lengths, trials=trials, seed=seed).steps


def latency_at_rows(profile: LatencyProfile, rows: float, width: float, kv: int | None) -> float | None:
    """L(rows, w, kv), linear in the row count between the two profiled batch sizes around it (rows below 1 read
    batch 1); None past the largest profiled batch size."""
    sizes = profile.batch_sizes
    rows = max(rows, 1.0)
    if rows > sizes[-1] + 1e-9:
        return None
    low = max(b for b in sizes if b <= rows + 1e-9)
    high = min(b for b in sizes if b >= rows - 1e-9)
    at = lambda b: profile.at_batch(b).latency_ms(max(width, 1.0), kv)  # noqa: E731
    if low == high:
        return at(low)
    return at(low) + (at(high) - at(low)) * (rows - low) / (high - low)


def batch_ms(profile: LatencyProfile, batch: SimulatedBatch, width: float, kv: int | None,
             draft_ms: float = 0.0, host_ms_per_row: float = 0.0) -> float | None:
    """Predicted decode ms of one simulated batch: each step's L(active rows, w, kv), the drafting per step and the
    host work of each active row, weighted by the chance the batch still runs then; None when the profile has no
    curve for the batch's rows."""
    if batch.active is None or batch.running is None:
        one = latency_at_rows(profile, batch.rows, width, kv)
        return None if one is None else batch.steps * (one + draft_ms + batch.rows * host_ms_per_row)
    total = 0.0
    for rows, chance in zip(batch.active, batch.running):
        one = latency_at_rows(profile, rows, width, kv)
        if one is None:
            return None
        total += chance * (one + draft_ms + rows * host_ms_per_row)
    return total


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

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

A drafter model's drafting (DraftCost) is priced on the drafter's own curve L_d(b, w), measured on its own engine
at the grid's batch sizes: its forwards per step over the rows still drafting, the first of each step catching up on
the tokens the last verification kept (the last draft and the bonus token when every draft was accepted: width 1 +
P(all accepted)), the rest one token a row. Without a drafter curve the drafting per step is the run's measured one.

The host work of a step outside the forward (the loop's bookkeeping, acceptance, a training-free method's lookup) is
priced per active row, as batch 1 measured it. Left out of the model, and so where a measurement can differ from
it: host work that grows otherwise with the batch, acceptance that differs between samples more than independent
draws from one set of rates do (a repetitive prompt accepts more at every step), and rows of unequal width in one
forward (the mean width stands in).
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


@dataclass(frozen=True)
class DraftCost:
    """A drafter model's drafting per step, priced on its own curve L_d(b, w): `forwards` batched drafter forwards
    a step over the rows still decoding, the first feeding `first_width` tokens a row (the accepted tail it catches
    up on), the others one."""

    profile: LatencyProfile  # the drafter's L_d(b, w) on its own engine
    forwards: float  # drafter forwards per decode step (gamma, fewer near the token cap)
    first_width: float = 1.0
    kv: int | None = None
    # the drafting's host work a step outside the drafter's forwards (caches rolled back, segments built), measured
    # at batch 1 (report/map_table.draft_host_ms): one batched drafting a step, whatever its rows (stop 57's map:
    # 1.2-1.9 ms a step beyond the curve's price at B = 1 to 8)
    host_ms: float = 0.0

    def ms(self, rows: float) -> float | None:
        """Drafting ms of one step over `rows` rows, None past the drafter curve's largest batch size."""
        if self.forwards <= 0:
            return 0.0
        first = latency_at_rows(self.profile, rows, self.first_width, self.kv)
        rest = latency_at_rows(self.profile, rows, 1.0, self.kv)
        if first is None or rest is None:
            return None
        return first * min(self.forwards, 1.0) + rest * max(self.forwards - 1.0, 0.0) + self.host_ms


def first_draft_width(rates: list[float] | None, gamma: float) -> float:
    """Tokens a row feeds its drafter in a step's first drafter forward: the corrected token, or the last draft and
    the bonus token when all `gamma` drafts were accepted (probability: the product of the first gamma rates)."""
    if not rates or gamma < 1:
        return 1.0
    every = 1.0
    for rate in rates[: int(round(gamma))]:
        every *= rate
    return 1.0 + (every if len(rates) >= int(round(gamma)) else 0.0)


@dataclass(frozen=True)
class BatchCost:
    """Predicted decode ms of one simulated batch, split into its parts (each summed over the batch's steps)."""

    forward_ms: float  # the target's verify forwards, L(rows, w, kv)
    draft_ms: float  # drafting
    host_ms: float  # host work per row

    @property
    def total_ms(self) -> float:
        return self.forward_ms + self.draft_ms + self.host_ms


def batch_cost(profile: LatencyProfile, batch: SimulatedBatch, width: float, kv: int | None,
               draft_ms: float = 0.0, host_ms_per_row: float = 0.0,
               drafter: DraftCost | None = None) -> BatchCost | None:
    """Predicted decode ms of one simulated batch, by part: each step's L(active rows, w, kv), its drafting (the
    drafter's forwards over the active rows when `drafter` is given, else `draft_ms`) and the host work of each
    active row, weighted by the chance the batch still runs then; None when a curve has no point for its rows."""
    steps = (list(zip(batch.active, batch.running)) if batch.active is not None and batch.running is not None
             else [(batch.rows, batch.steps)])
    forward = draft = host = 0.0
    for rows, weight in steps:
        one = latency_at_rows(profile, rows, width, kv)
        drafting = draft_ms if drafter is None else drafter.ms(rows)
        if one is None or drafting is None:
            return None
        forward, draft, host = forward + weight * one, draft + weight * drafting, host + weight * rows * host_ms_per_row
    return BatchCost(forward, draft, host)


def batch_ms(profile: LatencyProfile, batch: SimulatedBatch, width: float, kv: int | None,
             draft_ms: float = 0.0, host_ms_per_row: float = 0.0, drafter: DraftCost | None = None) -> float | None:
    """Predicted decode ms of one simulated batch (batch_cost's parts summed); None when a curve has no point for
    its rows."""
    cost = batch_cost(profile, batch, width, kv, draft_ms, host_ms_per_row, drafter)
    return None if cost is None else cost.total_ms


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

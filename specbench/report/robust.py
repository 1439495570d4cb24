"""Robust numbers beside the pooled speedup: how much do single prompt turns move it?

The headline speedup pools seconds (sum of tokens / sum of seconds, method over ar), so a turn that ran long carries
more weight than one that ran short; one slowed turn of ar's can lift every method's speedup (issue 30). Two numbers
show how far to trust it:
  speedup_median  = median over prompt turns of (tokens_per_s_method / tokens_per_s_ar) on that turn
  speedup_lo/_hi  = a 95% bootstrap interval of the pooled speedup: resample the prompt turns with replacement
                    (method and ar of a turn together), recompute the pooled ratio, take the 2.5% / 97.5% quantiles
The resampling is seeded (BOOTSTRAP_SEED), so a report redrawn from the same records gives the same interval; the
CI gates (ci/gate.py) judge the interval, not the point.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

RESAMPLES = 1000  # the quantiles of 1000 resamples move by about 0.5% of the interval's width between seeds
LEVEL = 0.95
BOOTSTRAP_SEED = 0


def turn_pairs(mine: pd.DataFrame, ar: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """One row per prompt turn both ran: new tokens and seconds of the method and of ar (summed when a key repeats,
    e.g. batched samples of one turn)."""
    cols = ["new_tokens", "wall_s"]
    a = mine.groupby(key, sort=False)[cols].sum()
    b = ar.groupby(key, sort=False)[cols].sum().add_suffix("_ar")
    return a.join(b, how="inner").reset_index()


def median_ratio(pairs: pd.DataFrame) -> float:
    """The median over turns of the method's tokens/s over ar's on the same turn (NaN without turns)."""
    ok = (pairs.wall_s > 0) & (pairs.wall_s_ar > 0) & (pairs.new_tokens_ar > 0)
    if not ok.any():
        return math.nan
    p = pairs[ok]
    return float(((p.new_tokens / p.wall_s) / (p.new_tokens_ar / p.wall_s_ar)).median())


def interval(pairs: pd.DataFrame, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
             level: float = LEVEL) -> tuple[float, float]:
    """(low, high) of the bootstrap interval of the pooled speedup; the point twice with one turn (nothing to
    resample), NaN without turns."""
    n = len(pairs)
    if n == 0:
        return math.nan, math.nan
    arrays = [pairs[c].to_numpy(dtype=float) for c in ("new_tokens", "wall_s", "new_tokens_ar", "wall_s_ar")]
    if n == 1:
        point = _pooled(*(a[None, :] for a in arrays))[0]
        return float(point), float(point)
    picks = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    ratios = _pooled(*(a[picks] for a in arrays))
    ratios = ratios[np.isfinite(ratios)]
    if not len(ratios):
        return math.nan, math.nan
    tail = (1 - level) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(low), float(high)


def _pooled(tokens, wall, tokens_ar, wall_ar) -> np.ndarray:
    """Pooled speedup per resample (rows): (sum tokens / sum seconds) over ar's."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (tokens.sum(1) / wall.sum(1)) / (tokens_ar.sum(1) / wall_ar.sum(1))


def bounds(row, column: str = "speedup") -> tuple[float, float]:
    """(low, high) of a summary row's interval; the point where the summary has no interval (summary.csv files
    from before the interval columns, or a row without turns to resample): judged as before."""
    point = _number(getattr(row, column, math.nan))
    low, high = _number(getattr(row, f"{column}_lo", math.nan)), _number(getattr(row, f"{column}_hi", math.nan))
    if math.isnan(low) or math.isnan(high):
        return point, point
    return low, high


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan

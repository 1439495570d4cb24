"""Robust numbers beside the pooled speedup: how much do single prompts move it?

The headline speedup pools seconds (sum of tokens / sum of seconds, method over ar), so a turn that ran long carries
more weight than one that ran short; one slowed turn of ar's can lift every method's speedup. Two numbers
show how far to trust it:
  speedup_median  = median over prompt turns of (tokens_per_s_method / tokens_per_s_ar) on that turn
  speedup_lo/_hi  = a 95% bootstrap interval of the pooled speedup: resample the independent units with replacement
                    (method and ar of a unit together), recompute the pooled ratio, take the 2.5% / 97.5% quantiles
The unit is what is independent: at batch 1 a prompt, all its turns together (a prompt's turns share
its task and its drafting luck), and at B > 1 a batch group (every sample of a batch shares the batch's one time,
and a group's later turns follow its first): resampling turns or samples would count one measurement B times and
narrow the interval by about sqrt(B) for nothing.
The resampling is seeded (BOOTSTRAP_SEED), so a report redrawn from the same records gives the same interval; the
CI gates (ci/gate.py) judge the interval, not the point. A percentile interval over few units is too narrow (it
covers less than its 95% with under ~10 units); the report says when the prompts are too few to mean much.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

RESAMPLES = 1000  # enough that the quantiles move by a small share of the interval's width between seeds
LEVEL = 0.95
BOOTSTRAP_SEED = 0
SIDES = ("new_tokens", "wall_s", "new_tokens_ar", "wall_s_ar")  # a pair's columns, per unit summed


def units(records: pd.DataFrame) -> pd.Series:
    """Per record, the bootstrap's unit: "<dataset>/<prompt_id>" at batch 1, "<dataset>/B<size>/<group>" at B > 1
    (batch_id "<size>-<group>-<turn>" without its turn; a batched row without a batch_id: its prompt)."""
    dataset = records["dataset"].astype(str) if "dataset" in records else pd.Series("", index=records.index)
    prompt = dataset + "/" + records["prompt_id"].astype(str)
    size = pd.to_numeric(records["batch_size"], errors="coerce").fillna(1) if "batch_size" in records else 1
    if "batch_id" not in records:
        return prompt
    batch = records["batch_id"].astype(str)
    group = batch.str.rsplit("-", n=1).str[0]
    known = (size > 1) & ~batch.isin(["", "nan", "None"]) & batch.str.contains("-")
    return prompt.where(~known, dataset + "/B" + group)


def turn_pairs(mine: pd.DataFrame, ar: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """One row per prompt turn both ran: new tokens and seconds of the method and of ar (summed when a key repeats,
    e.g. batched samples of one turn), and the turn's bootstrap unit (`unit`: the method's rows' unit)."""
    cols = ["new_tokens", "wall_s"]
    a = mine.assign(unit=units(mine)).groupby(key, sort=False).agg(
        new_tokens=("new_tokens", "sum"), wall_s=("wall_s", "sum"), unit=("unit", "first"))
    b = ar.groupby(key, sort=False)[cols].sum().add_suffix("_ar")
    return a.join(b, how="inner").reset_index()


def median_ratio(pairs: pd.DataFrame) -> float:
    """The median over turns of the method's tokens/s over ar's on the same turn (NaN without turns)."""
    ok = (pairs.wall_s > 0) & (pairs.wall_s_ar > 0) & (pairs.new_tokens_ar > 0)
    if not ok.any():
        return math.nan
    p = pairs[ok]
    return float(((p.new_tokens / p.wall_s) / (p.new_tokens_ar / p.wall_s_ar)).median())


def unit_sums(pairs: pd.DataFrame, columns=SIDES) -> np.ndarray:
    """[units, columns]: the pairs' columns summed per unit (pairs without `unit`: each row its own unit)."""
    unit = pairs["unit"] if "unit" in pairs else pd.Series(range(len(pairs)), index=pairs.index)
    return pairs.groupby(unit.to_numpy(), sort=False)[list(columns)].sum().to_numpy(dtype=float)


def interval(pairs: pd.DataFrame, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
             level: float = LEVEL) -> tuple[float, float]:
    """(low, high) of the bootstrap interval of the pooled speedup, units resampled; the point twice with one unit
    (nothing to resample), NaN without turns."""
    return resampled(unit_sums(pairs), _pooled, resamples, seed, level)


def resampled(sums: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], resamples: int = RESAMPLES,
              seed: int = BOOTSTRAP_SEED, level: float = LEVEL) -> tuple[float, float]:
    """(low, high) percentile interval of statistic(sums of a resample), units (rows of `sums`) drawn with
    replacement. statistic takes [resamples, columns] totals and gives one number per resample."""
    n = len(sums)
    if n == 0:
        return math.nan, math.nan
    if n == 1:
        point = float(statistic(sums.sum(0)[None, :])[0])
        return point, point
    picks = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    values = statistic(sums[picks].sum(1))
    values = values[np.isfinite(values)]
    if not len(values):
        return math.nan, math.nan
    tail = (1 - level) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return float(low), float(high)


def _pooled(totals: np.ndarray) -> np.ndarray:
    """Pooled speedup per resample (rows of [tokens, wall, tokens_ar, wall_ar] totals): (tokens / seconds) over
    ar's."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (totals[:, 0] / totals[:, 1]) / (totals[:, 2] / totals[:, 3])


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

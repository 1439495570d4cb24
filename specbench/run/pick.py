"""`specbench recommend`'s measured pick: which method, from a short confirming run of a few prompts.

Taking the best point estimate of five prompts is a winner's curse: among several methods within the noise of one
another, the largest measured number is the luckiest as often as the fastest, and filing it sends every later run
to a method no better than a simpler one. So:
- each measured method's speedup over ar is the pooled one on the turns both finished, with its 95% bootstrap
  interval (run/intervals.py: prompts resampled);
- only methods that may be picked take part: in float32 a method that matches ar on every checked turn; in bf16 or
  float16 one that matches, or whose every difference is a near-tie within the dtype's rounding (explained); `ar`
  always; a method that is not is named in the notes, with why;
- the fastest by the point is compared with each other one on the turns both finished (paired: the ratio of their
  pooled rates, with its interval): every method the fastest does not beat beyond the noise (the interval of its
  rate over the fastest's reaches 1) is tied with it, and of the tied ones the simplest is picked: `ar` (nothing
  to set up), then fewer artefacts (pld needs none; a tree method its trained artefact and its tree), then the
  smaller tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from . import intervals as robust
from .lossless import explained_rate

TURN = ["dataset", "prompt_id", "turn"]


@dataclass(frozen=True)
class Measured:
    """One method's measured speedup over ar with its interval, and its share of checked turns that match ar
    (lossless) or match or differ by a near-tie (explained); None: not checked (T > 0, no reference)."""

    speedup: float
    low: float
    high: float
    lossless: float | None
    explained: float | None
    turns: int


def measure(records: pd.DataFrame) -> dict[str, Measured]:
    """method -> Measured, from a confirming run's batch-1 records (ar: 1.0 by definition)."""
    ar = records[records.method == "ar"]
    out = {}
    for method, g in records.groupby("method", sort=False):
        pairs = robust.turn_pairs(g, ar, TURN)
        totals = pairs[list(robust.SIDES)].sum()
        point = (totals.new_tokens / totals.wall_s) / (totals.new_tokens_ar / totals.wall_s_ar) \
            if len(pairs) and totals.wall_s > 0 and totals.new_tokens_ar > 0 else math.nan
        low, high = (1.0, 1.0) if method == "ar" else robust.interval(pairs)
        checked = g.lossless[g.lossless.astype(str) != ""] if "lossless" in g else pd.Series(dtype=str)
        share = float((checked == "match").mean()) if len(checked) else None
        explained = explained_rate(g) if share is not None and "mismatch_explained" in g else share
        explained = share if explained is None or (isinstance(explained, float) and math.isnan(explained)) \
            else float(explained)
        out[str(method)] = Measured(round(float(point), 4), round(low, 4), round(high, 4), share, explained,
                                    len(pairs))
    return out


def eligible(method: str, m: Measured, dtype: str) -> str:
    """"" when `method` may be picked in `dtype`, else why not."""
    if method == "ar" or m.lossless is None or m.lossless >= 1:
        return ""
    differ = f"{1 - m.lossless:.0%} of its turns differ from ar"
    if dtype == "float32":
        return f"{differ} in float32, where a lossless method matches exactly"
    if m.explained is not None and m.explained >= 1:
        return ""  # every difference a near-tie within the dtype's rounding
    return f"{differ} and not every difference is a near-tie within {dtype}'s rounding (unexplained)"


def simplicity(method: str, artefacts: int, size: int | None) -> tuple:
    """Sort key, simplest first: ar, then fewer artefacts, then the smaller tree, then the name."""
    return (method != "ar", artefacts, size or 0, method)


def choose(measured: dict[str, Measured], records: pd.DataFrame, dtype: str,
           cost: dict[str, tuple[int, int | None]]) -> tuple[str, list[str]]:
    """(picked method, notes saying why, and why others were not picked). cost: method -> (artefacts, tree size)."""
    notes, ok = [], []
    for method, m in measured.items():
        why = eligible(method, m, dtype)
        if why:
            notes.append(f"{method} not picked: {why}")
        elif math.isfinite(m.speedup):
            ok.append(method)
    best = max(ok, key=lambda k: measured[k].speedup)
    tied = {best: None}
    for method in ok:
        if method != best:
            low, high, turns = paired_ratio(records, method, best)
            if not high < 1:  # not beaten beyond the noise (NaN: one turn, nothing to tell them apart)
                tied[method] = (low, high, turns)
    pick = min(tied, key=lambda k: simplicity(k, *cost.get(k, (0, None))))
    m = measured[best]
    if pick == best:
        notes.insert(0, f"{best}: the fastest measured, {_x(m.speedup)} (95% interval {_x(m.low)}-{_x(m.high)})"
                     + (f"; tied within the noise: {', '.join(k for k in tied if k != best)}, not simpler"
                        if len(tied) > 1 else ""))
    else:
        low, high, turns = tied[pick]
        notes.insert(0, f"{pick}: within the noise of the fastest measured, {best} at {_x(m.speedup)} (on {turns} "
                     f"turns {pick} ran at {_span(low, high)} of {best}'s rate), and simpler")
    return pick, notes


def paired_ratio(records: pd.DataFrame, method: str, other: str) -> tuple[float, float, int]:
    """(low, high, turns): the 95% interval of `method`'s pooled rate over `other`'s on the turns both finished."""
    pairs = robust.turn_pairs(records[records.method == method], records[records.method == other], TURN)
    low, high = robust.interval(pairs) if len(pairs) > 1 else (math.nan, math.nan)
    return low, high, len(pairs)


def _x(value: float) -> str:
    return f"{value:.2f}x" if math.isfinite(value) else "-"


def _span(low: float, high: float) -> str:
    return f"{low:.2f}-{high:.2f}x" if math.isfinite(low) and math.isfinite(high) else "an unknown share"

"""A run against a baseline on the same prompts, turn by turn: the change of each method's speedup with a
paired interval.

Two runs' summaries each carry an interval, but prompts differ far more from one another than one prompt does
between two runs; two intervals that each hold that spread overlap for any realistic regression, so comparing them
(this run's upper end against the baseline's lower end) would miss a uniform slowdown of every prompt. With both
runs' records the same prompt turns are compared with each other:
  change    = pooled speedup of this run / pooled speedup of the baseline, on the prompt turns both runs (and
              both runs' ar) finished, as a percentage
  change_lo, change_hi = its 95% bootstrap interval: the independent units (a prompt at batch 1, a batch group at
              B > 1: run/intervals.py) resampled, each unit's turns of both runs together, so the spread between
              prompts cancels and only the run-to-run noise is left
Rows are named as the summary names them ("sd B=8 unpadded"), each against ar at its batch size in its own run.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..run import intervals as robust
from ..report.summary import row_name
from ..run.results import with_batch_columns

TURN = ["dataset", "prompt_id", "turn"]
COLUMNS = ["method", "dataset", "paired_turns", "paired_units", "paired_change", "paired_change_lo",
           "paired_change_hi"]


def side_pairs(records: pd.DataFrame) -> dict[tuple[str, str], pd.DataFrame]:
    """(row name, dataset) -> one run's turn pairs of that method against ar at its batch size (robust.turn_pairs)."""
    records = with_batch_columns(records)
    records = records.assign(prompt_id=records.prompt_id.astype(str), turn=records.turn.astype(int))
    out = {}
    for (method, dataset, size, mode), g in records.groupby(["method", "dataset", "batch_size", "batching"],
                                                            sort=False):
        if method == "ar":
            continue
        ar = records[(records.method == "ar") & (records.dataset == dataset) & (records.batch_size == size)]
        name = row_name(pd.Series({"method": method, "batch_size": size, "batching": mode}))
        out[(name, str(dataset))] = robust.turn_pairs(g, ar, TURN)
    return out


def changes(new: pd.DataFrame, old: pd.DataFrame) -> pd.DataFrame:
    """Per row both runs have on some common turns: COLUMNS (changes in percent; NaN interval with one unit)."""
    a, b = side_pairs(new), side_pairs(old)
    rows = []
    for key in a.keys() & b.keys():
        both = a[key].merge(b[key].drop(columns="unit"), on=TURN, suffixes=("", "_base"))
        if both.empty:
            continue
        cols = list(robust.SIDES) + [f"{c}_base" for c in robust.SIDES]
        sums = robust.unit_sums(both, cols)
        point = float(_change(sums.sum(0)[None, :])[0])
        low, high = robust.resampled(sums, _change) if len(sums) > 1 else (math.nan, math.nan)
        rows.append({"method": key[0], "dataset": key[1], "paired_turns": len(both), "paired_units": len(sums),
                     "paired_change": _percent(point), "paired_change_lo": _percent(low),
                     "paired_change_hi": _percent(high)})
    return pd.DataFrame(rows, columns=COLUMNS)


def _change(totals: np.ndarray) -> np.ndarray:
    """This run's pooled speedup over the baseline's, per row of 8 totals (this run's 4, then the baseline's)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        new = (totals[:, 0] / totals[:, 1]) / (totals[:, 2] / totals[:, 3])
        old = (totals[:, 4] / totals[:, 5]) / (totals[:, 6] / totals[:, 7])
        return new / old


def _percent(ratio: float) -> float:
    return round((ratio - 1) * 100, 2) if math.isfinite(ratio) else math.nan

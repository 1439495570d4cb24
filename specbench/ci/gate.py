"""CI checks per method x dataset (ar excluded): lossless, floor (--fail-below), regression (--fail-regression).

Speedups are judged by their 95% bootstrap interval (report/robust.py), not the point, so that one slow prompt
cannot fail (or pass) a gate: --fail-below fails only when the interval's upper end is below the threshold; a
regression is a drop of more than PCT percent (the point) that the intervals say is real, i.e. this run's upper end
is below the baseline's lower end. Summaries without intervals (older summary.csv files) are judged on the point.

Each check passes, fails, or is skipped with a reason. A speedup judged on disturbed timings (the noise guard,
noise.py; this run's or the baseline's row) is skipped as "not judged" unless --judge-disturbed: a gate never
passes or fails on numbers the noise guard distrusts, and says so (exit 3). Tau and exactness do not depend on
timing and are judged either way.

Exit codes of a gated report (--fail-below or --fail-regression given): 1 when any check failed (a lossless check
included), else 3 when a check was not judged on disturbed timings, else 0. Without a gate the report exits 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..report.robust import bounds
from ..run.noise import is_disturbed

NOT_JUDGED_EXIT, FAILED_EXIT = 3, 1


@dataclass(frozen=True)
class Check:
    method: str
    dataset: str
    name: str  # lossless | floor | regression
    status: str  # passed | failed | skipped
    message: str
    not_judged: bool = False  # skipped because its timing is disturbed (exit 3 unless something failed)


def _nan(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def methods_only(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of methods other than ar (the baseline's own rows are 1.0 by definition); compared runs label methods
    '<run>:<method>'."""
    return frame[frame.method.astype(str).str.split(":").str[-1].str.split(" ").str[0] != "ar"]  # "ar B=8 ..."


def lossless_checks(summary: pd.DataFrame) -> list[Check]:
    """A lossless method's tokens must equal ar's wherever the dtype's rounding does not explain a difference."""
    checks = []
    for r in methods_only(summary).itertuples(index=False):
        exact = getattr(r, "lossless_rate", math.nan)
        explained = getattr(r, "lossless_explained_rate", exact)
        explained = exact if _nan(explained) else explained
        if str(getattr(r, "exactness", "")) == "lossy":
            checks.append(Check(r.method, r.dataset, "lossless", "skipped", "lossy method: exactness not promised"))
        elif _nan(exact):
            checks.append(Check(r.method, r.dataset, "lossless", "skipped",
                                "not checked: temperature > 0 or no ar reference"))
        elif explained < 1:
            checks.append(Check(r.method, r.dataset, "lossless", "failed",
                                f"{1 - explained:.0%} of prompt turns differ from ar where the dtype's rounding does "
                                "not explain it (report.md: Lossless check FAILED)"))
        else:
            checks.append(Check(r.method, r.dataset, "lossless", "passed",
                                f"exact {exact:.0%}, exact or explained {explained:.0%}"))
    return checks


def floor_checks(summary: pd.DataFrame, threshold: float, judge_disturbed: bool) -> list[Check]:
    """--fail-below: fails when a method's speedup interval lies wholly below `threshold` (its upper end is below
    it); an interval that reaches the threshold passes, with a note when the point itself is below."""
    checks = []
    for r in methods_only(summary).itertuples(index=False):
        shaky = is_disturbed(getattr(r, "timing", ""))
        low, high = bounds(r)
        text = f"speedup {r.speedup:.3f}" + (f" (95% interval {low:.3f}-{high:.3f})" if low != high else "")
        anyway = " (timing disturbed, judged anyway)" if shaky else ""
        if shaky and not judge_disturbed:
            checks.append(Check(r.method, r.dataset, "floor", "skipped", f"not judged: timing {r.timing}", True))
        elif _nan(r.speedup) or _nan(high) or high < threshold:
            checks.append(Check(r.method, r.dataset, "floor", "failed", f"{text} < {threshold}"))
        elif r.speedup < threshold:
            checks.append(Check(r.method, r.dataset, "floor", "passed", f"{text}: below {threshold} but within the "
                                "noise (the interval's upper end reaches it)" + anyway))
        else:
            checks.append(Check(r.method, r.dataset, "floor", "passed", f"{text} >= {threshold}" + anyway))
    return checks


def regression_checks(delta: pd.DataFrame, pct: float, judge_disturbed: bool) -> list[Check]:
    """--fail-regression PCT: speedup fell by more than PCT percent of the baseline and beyond the noise (this run's
    interval wholly below the baseline's), tau fell by more than PCT percent, or exactness fell: the
    exact-or-explained rate fell, or the exact rate fell while some difference is unexplained (an exact-rate fall
    made only of near-ties within the dtype's rounding is noted, not failed: bf16 batching flips them)."""
    checks = []
    for r in methods_only(delta[delta.status != "gone"]).itertuples(index=False):
        if r.status == "new":
            checks.append(Check(r.method, r.dataset, "regression", "skipped",
                                "no baseline row (a new method or dataset)"))
            continue
        failed, notes = [], []
        shaky = is_disturbed(r.timing) or is_disturbed(r.timing_base)
        speedup_fell = not _nan(r.speedup_change) and r.speedup_change < -pct
        speedup_text = f"speedup {r.speedup_base:.3f} -> {r.speedup:.3f} ({r.speedup_change:+.1f}%)"
        if shaky and not judge_disturbed:
            notes.append(f"{speedup_text} not judged: timing disturbed "
                         f"({'this run' if is_disturbed(r.timing) else 'baseline'})")
        elif speedup_fell and _beyond_noise(r):
            failed.append(f"{speedup_text}, more than {pct:g}% down and beyond the noise ({_intervals(r)})")
        elif speedup_fell:
            notes.append(f"the drop is within the noise ({_intervals(r)} overlap)")
        if shaky and judge_disturbed:
            notes.append("timing disturbed, judged anyway")
        if not _nan(r.tau_change) and r.tau_change < -pct:
            failed.append(f"tau {r.tau_base:.3f} -> {r.tau:.3f} ({r.tau_change:+.1f}%), more than {pct:g}% down")
        if str(r.exactness) != "lossy":
            failed += _exactness_fell(r, notes)
        if failed:
            checks.append(Check(r.method, r.dataset, "regression", "failed", "; ".join(failed + notes)))
        elif shaky and not judge_disturbed:
            checks.append(Check(r.method, r.dataset, "regression", "skipped", "; ".join(notes), True))
        else:
            ok = f"{speedup_text}, tau {r.tau_base:.3f} -> {r.tau:.3f}: within {pct:g}%"
            checks.append(Check(r.method, r.dataset, "regression", "passed", "; ".join([ok] + notes)))
    return checks


def _beyond_noise(r) -> bool:
    """This run's speedup interval lies wholly below the baseline's (no interval: the points, as before)."""
    low_base = _side_bound(r, "speedup_lo_base", r.speedup_base)
    high = _side_bound(r, "speedup_hi", r.speedup)
    return high < low_base


def _intervals(r) -> str:
    return (f"95% intervals {_side_bound(r, 'speedup_lo', r.speedup):.3f}-{_side_bound(r, 'speedup_hi', r.speedup):.3f}"
            f" vs baseline {_side_bound(r, 'speedup_lo_base', r.speedup_base):.3f}-"
            f"{_side_bound(r, 'speedup_hi_base', r.speedup_base):.3f}")


def _side_bound(r, column: str, point: float) -> float:
    """One end of a side's interval from the comparison row; the point where that side has none."""
    value = getattr(r, column, math.nan)
    return point if _nan(value) else value


def _exactness_fell(r, notes: list[str]) -> list[str]:
    explained, explained_base = r.explained, r.explained_base
    if _nan(explained) or _nan(explained_base):  # a summary without the rate: the exact rate stands for it
        explained, explained_base = r.lossless, r.lossless_base
    exact_fell = not _nan(r.lossless) and not _nan(r.lossless_base) and r.lossless < r.lossless_base - 1e-9
    if not _nan(explained) and not _nan(explained_base) and explained < explained_base - 1e-9:
        return [f"exact-or-explained lossless rate fell {explained_base:.0%} -> {explained:.0%}"]
    if exact_fell and not _nan(explained) and explained < 1:
        return [f"lossless rate fell {r.lossless_base:.0%} -> {r.lossless:.0%}"]
    if exact_fell:
        notes.append(f"exact lossless rate {r.lossless_base:.0%} -> {r.lossless:.0%}, every difference a near-tie "
                     "within the dtype's rounding")
    return []


def exit_code(checks: list[Check], gated: bool) -> int:
    if not gated:
        return 0
    if any(c.status == "failed" for c in checks):
        return FAILED_EXIT
    return NOT_JUDGED_EXIT if any(c.not_judged for c in checks) else 0


def verdict(checks: list[Check], gated: bool) -> str:
    """PASSED, FAILED, NOT JUDGED (gated), or REPORT (no gate asked)."""
    return {0: "PASSED" if gated else "REPORT", FAILED_EXIT: "FAILED", NOT_JUDGED_EXIT: "NOT JUDGED"}[
        exit_code(checks, gated)]

"""CI checks per method x dataset (ar excluded): lossless, floor (--fail-below), regression (--fail-regression).

Speedups are judged by their 95% interval (run/intervals.py), not the point, so that one slow prompt cannot fail
(or pass) a gate. Each timing gate has three outcomes, by where the interval lies against its threshold:
- --fail-below X: passes when the interval's lower end clears X, fails when its upper end is below X, and is
  "within the noise" when the interval straddles X (the run cannot tell; more prompts or repeats can).
- --fail-regression PCT against a baseline whose records share prompt turns with this run: the change of the speedup
  is measured turn by turn with a paired interval (paired.py). It fails when the change is more than PCT% down and
  the whole interval is below 0 (a fall beyond the noise), passes when the interval's lower end is above -PCT% (any
  fall is under PCT%), and is within the noise otherwise. Without both runs' records (a bare summary.csv baseline)
  the two summaries' own intervals are compared, unpaired: a fall of more than PCT% fails when this run's interval
  lies wholly below the baseline's, and is within the noise when they overlap; a smaller fall passes.
Summaries without intervals (older summary.csv files) are judged on the point.

Each check passes, fails, is within the noise, or is skipped with a reason. A speedup judged on disturbed timings
(the noise guard, noise.py; this run's or the baseline's row) is skipped as "not judged" unless --judge-disturbed: a
gate never passes or fails on numbers the noise guard distrusts, and says so. Tau and exactness do not depend on
timing and are judged on the point either way.

Exit codes of a gated report (--fail-below or --fail-regression given), the first that applies:
  1  a check failed (a lossless check included)
  3  not judged: a check's timing was disturbed (re-run quietly, or --judge-disturbed)
  4  within the noise: a speedup's interval straddles its threshold (more prompts, --repeats, a quieter machine)
  0  every check passed
Without a gate the report exits 0 (2: bad input, as every command).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..run.intervals import bounds
from ..run.noise import is_disturbed

NOT_JUDGED_EXIT, FAILED_EXIT, NOISE_EXIT = 3, 1, 4
EXIT_CODES = ("exit codes with a gate: 1 a check failed; 3 not judged (timing disturbed); 4 within the noise (a "
              "speedup's 95% interval straddles its threshold); 0 passed")


@dataclass(frozen=True)
class GateOutcome:
    """One CI gate's outcome for a method x dataset: the lossless, speedup-floor or regression gate."""

    method: str
    dataset: str
    name: str  # lossless | floor | regression
    status: str  # passed | failed | skipped
    message: str
    not_judged: bool = False  # skipped because its timing is disturbed (exit 3 unless something failed)
    within_noise: bool = False  # skipped because the interval straddles the threshold (exit 4: cannot tell)


def _nan(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def methods_only(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of methods other than ar (the baseline's own rows are 1.0 by definition); compared runs label methods
    '<run>:<method>'."""
    return frame[frame.method.astype(str).str.split(":").str[-1].str.split(" ").str[0] != "ar"]  # "ar B=8 ..."


def lossless_checks(summary: pd.DataFrame) -> list[GateOutcome]:
    """A lossless method's tokens must equal ar's wherever the dtype's rounding does not explain a difference."""
    checks = []
    for r in methods_only(summary).itertuples(index=False):
        exact = getattr(r, "lossless_rate", math.nan)
        explained = getattr(r, "lossless_explained_rate", exact)
        explained = exact if _nan(explained) else explained
        if str(getattr(r, "exactness", "")) == "lossy":
            checks.append(GateOutcome(r.method, r.dataset, "lossless", "skipped", "lossy method: exactness not promised"))
        elif _nan(exact):
            checks.append(GateOutcome(r.method, r.dataset, "lossless", "skipped",
                                "not checked: temperature > 0 or no ar reference"))
        elif explained < 1:
            checks.append(GateOutcome(r.method, r.dataset, "lossless", "failed",
                                f"{1 - explained:.0%} of prompt turns differ from ar where the dtype's rounding does "
                                "not explain it (report.md: Lossless check FAILED)"))
        else:
            checks.append(GateOutcome(r.method, r.dataset, "lossless", "passed",
                                f"exact {exact:.0%}, exact or explained {explained:.0%}"))
    return checks


def floor_checks(summary: pd.DataFrame, threshold: float, judge_disturbed: bool) -> list[GateOutcome]:
    """--fail-below: passes when a method's speedup interval lies wholly at or above `threshold` (its lower end
    clears it), fails when it lies wholly below, and is within the noise when it straddles the threshold."""
    checks = []
    for r in methods_only(summary).itertuples(index=False):
        shaky = is_disturbed(getattr(r, "timing", ""))
        low, high = bounds(r)
        text = f"speedup {r.speedup:.3f}" + (f" (95% interval {low:.3f}-{high:.3f})" if low != high else "")
        anyway = " (timing disturbed, judged anyway)" if shaky else ""
        if shaky and not judge_disturbed:
            checks.append(GateOutcome(r.method, r.dataset, "floor", "skipped", f"not judged: timing {r.timing}", True))
        elif _nan(r.speedup) or _nan(high) or high < threshold:
            checks.append(GateOutcome(r.method, r.dataset, "floor", "failed", f"{text} < {threshold}"))
        elif low < threshold:
            checks.append(GateOutcome(r.method, r.dataset, "floor", "skipped", f"within the noise: {text} straddles "
                                f"{threshold}; more prompts or --repeats would tell" + anyway, within_noise=True))
        else:
            checks.append(GateOutcome(r.method, r.dataset, "floor", "passed", f"{text} >= {threshold}" + anyway))
    return checks


def regression_checks(delta: pd.DataFrame, pct: float, judge_disturbed: bool) -> list[GateOutcome]:
    """--fail-regression PCT: the speedup's change judged by its paired interval where both runs' records share
    prompt turns, else by the two runs' intervals (the module's note); tau fell by more than PCT percent; or
    exactness fell: the exact-or-explained rate fell, or the exact rate fell while some difference is unexplained
    (an exact-rate fall made only of near-ties within the dtype's rounding is noted, not failed: bf16 batching
    flips them)."""
    checks = []
    for r in methods_only(delta[delta.status != "gone"]).itertuples(index=False):
        if r.status == "new":
            checks.append(GateOutcome(r.method, r.dataset, "regression", "skipped",
                                "no baseline row (a new method or dataset)"))
            continue
        failed, notes, noisy = [], [], False
        shaky = is_disturbed(r.timing) or is_disturbed(r.timing_base)
        if shaky and not judge_disturbed:
            notes.append(f"speedup {r.speedup_base:.3f} -> {r.speedup:.3f} ({r.speedup_change:+.1f}%) not judged: "
                         f"timing disturbed ({'this run' if is_disturbed(r.timing) else 'baseline'})")
        else:
            verdict, said = _speedup_verdict(r, pct)
            (failed if verdict == "failed" else notes).append(said)
            noisy = verdict == "noise"
        if shaky and judge_disturbed:
            notes.append("timing disturbed, judged anyway")
        if not _nan(r.tau_change) and r.tau_change < -pct:
            failed.append(f"tau {r.tau_base:.3f} -> {r.tau:.3f} ({r.tau_change:+.1f}%), more than {pct:g}% down")
        if str(r.exactness) != "lossy":
            failed += _exactness_fell(r, notes)
        if failed:
            checks.append(GateOutcome(r.method, r.dataset, "regression", "failed", "; ".join(failed + notes)))
        elif shaky and not judge_disturbed:
            checks.append(GateOutcome(r.method, r.dataset, "regression", "skipped", "; ".join(notes), True))
        elif noisy:
            checks.append(GateOutcome(r.method, r.dataset, "regression", "skipped",
                                    "within the noise: " + "; ".join(notes), within_noise=True))
        else:
            tau = f"tau {r.tau_base:.3f} -> {r.tau:.3f}: within {pct:g}%"
            checks.append(GateOutcome(r.method, r.dataset, "regression", "passed", "; ".join(notes + [tau])))
    return checks


def _speedup_verdict(r, pct: float) -> tuple[str, str]:
    """("failed" | "noise" | "passed", what to say) for one comparison row's speedup."""
    text = f"speedup {r.speedup_base:.3f} -> {r.speedup:.3f} ({r.speedup_change:+.1f}%)"
    change = getattr(r, "paired_change", math.nan)
    if not _nan(change):  # paired, turn by turn on the prompts both runs ran
        low, high = getattr(r, "paired_change_lo", math.nan), getattr(r, "paired_change_hi", math.nan)
        low, high = (change, change) if _nan(low) or _nan(high) else (low, high)
        turns = f"paired on {int(r.paired_turns)} turns: {change:+.1f}%, 95% interval {low:+.1f}% .. {high:+.1f}%"
        if change < -pct and high < 0:
            return "failed", f"{text}, more than {pct:g}% down and beyond the noise ({turns})"
        if low >= -pct:
            return "passed", f"{text}, within {pct:g}% ({turns})"
        return "noise", (f"{text}: the interval reaches more than {pct:g}% down and does not rule out "
                         f"{'no change' if change < -pct else f'a fall of more than {pct:g}%'} ({turns})")
    if _nan(r.speedup_change) or r.speedup_change >= -pct:  # unpaired: the baseline's records are not at hand
        return "passed", f"{text}, within {pct:g}% (unpaired: no baseline records)"
    if _beyond_noise(r):
        return "failed", f"{text}, more than {pct:g}% down and beyond the noise ({_intervals(r)}; unpaired)"
    return "noise", f"{text}: the drop is within the noise ({_intervals(r)} overlap; unpaired)"


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


def exit_code(checks: list[GateOutcome], gated: bool) -> int:
    """The module's exit codes: failed 1, then not judged 3, then within the noise 4, else 0."""
    if not gated:
        return 0
    if any(c.status == "failed" for c in checks):
        return FAILED_EXIT
    if any(c.not_judged for c in checks):
        return NOT_JUDGED_EXIT
    return NOISE_EXIT if any(c.within_noise for c in checks) else 0


def verdict(checks: list[GateOutcome], gated: bool) -> str:
    """PASSED, FAILED, NOT JUDGED, WITHIN THE NOISE (gated), or REPORT (no gate asked)."""
    return {0: "PASSED" if gated else "REPORT", FAILED_EXIT: "FAILED", NOT_JUDGED_EXIT: "NOT JUDGED",
            NOISE_EXIT: "WITHIN THE NOISE"}[exit_code(checks, gated)]

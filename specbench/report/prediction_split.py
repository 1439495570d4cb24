"""A tree's measured speedup against its prediction, the error split in two: the acceptance part and
the step-cost part, so report.md says which one misses.

At batch 1 a run's tokens/s is tau / step, where step = decode seconds / steps = wall_s / target_forwards of the
records (summary.csv's forward_ms; the prefill forward is one of the steps, as in tau = new_tokens /
target_forwards), and ar's is 1 / its step (tau 1). The prediction is tau_p L(1) / step_p on the profile's clock
(buildtree.predict: predicted_step_ms = verify forward + drafting, ar_step_ms = L(1)). So

    speedup / predicted_speedup = (tau / tau_p) x ((step_p / L(1)) / (step / ar's step))
                                =  tau_part     x  cost_part

Both step costs are counted in ar steps, so a machine that runs slower or faster than when it was profiled (the
absolute ms differ) moves neither part. cost_part is what the pricing controls (the verify forward from the profile,
the drafting as a run pays it); tau_part comes from the acceptance file (often estimated on another dataset).
"""

from __future__ import annotations

import math

import pandas as pd

GOAL = 0.05  # a part misses when it is more than 5% from 1 (the accuracy a prediction aims for)
SPLIT_COLUMNS = ["predicted_step_ms", "step_ms", "tau_part", "cost_part", "misses"]


def split(row: dict, info: dict, ar_step_ms: float) -> dict:
    """The split columns of one tree row: `row` has the measured tau, speedup and forward_ms (ms per step), `info`
    is run.yaml's prediction of the tree (predicted_tau, predicted_speedup, predicted_step_ms, ar_step_ms), and
    `ar_step_ms` is ar's measured ms per step on the same turns. NaN (and misses "-") where a number is missing:
    no profile, or a run.yaml from before predicted_step_ms (then cost_part is the speedup ratio over tau_part)."""
    step, pred_step, pred_ar = _num(row.get("forward_ms")), _num(info.get("predicted_step_ms")), _num(
        info.get("ar_step_ms"))
    tau_part = _ratio(_num(row.get("tau")), _num(info.get("predicted_tau")))
    cost_part = _ratio(_ratio(pred_step, pred_ar), _ratio(step, _num(ar_step_ms)))
    if math.isnan(cost_part):  # an older run.yaml: what the tau part leaves of the speedup's error
        cost_part = _ratio(_ratio(_num(row.get("speedup")), _num(info.get("predicted_speedup"))), tau_part)
    return {"predicted_step_ms": round(pred_step, 3), "step_ms": round(step, 3), "tau_part": round(tau_part, 3),
            "cost_part": round(cost_part, 3), "misses": misses(tau_part, cost_part)}


def misses(tau_part: float, cost_part: float) -> str:
    """Which part is more than GOAL from 1: "tau", "cost", "tau, cost", "neither", or "-" when unknown."""
    if math.isnan(tau_part) or math.isnan(cost_part):
        return "-"
    off = [name for name, part in (("tau", tau_part), ("cost", cost_part)) if abs(part - 1) > GOAL]
    return ", ".join(off) or "neither"


def ar_steps(summary: pd.DataFrame) -> dict:
    """dataset -> ar's measured ms per step (forward_ms) in a batch-1 summary."""
    if "forward_ms" not in summary:
        return {}
    ar = summary[(summary.method == "ar") & (summary.batch_size == 1 if "batch_size" in summary else True)]
    return {d: _num(ms) for d, ms in zip(ar.dataset, ar.forward_ms)}


def lines(frame: pd.DataFrame) -> list[str]:
    """report.md's account of the split under the trees table: what the columns are, and which part misses."""
    if "cost_part" not in frame or frame.cost_part.isna().all():
        return []
    md = ["`predicted_step_ms`: the prediction's ms per step (verify forward + drafting, the profile's clock); "
          "`step_ms`: measured, decode seconds / steps (wall_s / target_forwards, summary.csv's forward_ms). "
          "speedup / predicted_speedup = `tau_part` x `cost_part`: `tau_part` = tau / predicted_tau (the acceptance "
          "file's estimate), `cost_part` = predicted step / measured step, each in ar steps (profile L(1), ar's "
          f"measured step): below 1 the step costs more than it was priced, above 1 less. The pricing controls "
          f"`cost_part`; the goal is within {GOAL:.0%} of 1. `misses` names the parts more than {GOAL:.0%} off. "
          "These columns are also in tree_sizes.csv.", ""]
    known = frame[frame.misses != "-"]
    cost = known[known.misses.str.contains("cost")]
    tau = known[known.misses.str.contains("tau")]
    if len(known):
        md += [f"Step cost within {GOAL:.0%} for {len(known) - len(cost)} of {len(known)} tree row(s)"
               + (": misses for " + ", ".join(f"{r.method} on {r.dataset} (x{r.cost_part:.2f})"
                                              for r in cost.itertuples()) if len(cost) else "")
               + f"; tau within {GOAL:.0%} for {len(known) - len(tau)} of {len(known)}"
               + (": misses for " + ", ".join(f"{r.method} on {r.dataset} (x{r.tau_part:.2f})"
                                              for r in tau.itertuples()) if len(tau) else "") + ".", ""]
    return md


def _num(value) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out if math.isfinite(out) else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if not (math.isnan(a) or math.isnan(b)) and b > 0 else math.nan

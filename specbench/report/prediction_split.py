"""A tree's measured speedup against its prediction, the error split in two: the acceptance part and
the step-cost part, so report.md says which one misses.

The prediction prices decode steps: tau_p tokens per verification and step_p ms per verification (buildtree.predict:
predicted_step_ms = verify forward + drafting, ar_step_ms = L(1)); the prefill is not a step. So the measurement is
read on decode steps too (summary.py's decode_steps: decode_tau = (new tokens - 1) / (forwards - 1), step = (wall_s -
ttft_s) / (forwards - 1), the same for ar), and

    decode_speedup / predicted_speedup = (tau / tau_p) x ((step_p / L(1)) / (step / ar's step))
                                       =  tau_part     x  cost_part

where decode_speedup = tau x ar's step / step (the speedup of the decode alone, what the prediction is). Both step
costs are counted in ar steps, so a machine that runs slower or faster than when it was profiled (the absolute ms
differ) moves neither part. cost_part is what the pricing controls (the verify forward from the profile, the drafting
as a run pays it); tau_part comes from the acceptance file (often estimated on another dataset). A summary without
the decode columns (an older run) is read with the prefill as a step (tau = new_tokens / target_forwards, step =
wall_s / target_forwards).

Where the step cost misses, the measured step is split into its parts, ms a decode step: `draft_ms` (the timed
drafting, summary's draft_s) and `host_ms` (the host work outside the target's forwards and the drafting: masks, tree
building, top-k, acceptance; host_overhead x wall_s), the rest the verify forward. The pricing has no host part, so a
tree method whose host work outweighs ar's misses by it (stop 67's compiled float32 run: medusa's 1.98 ms against
ar's 0.49, benchmarks/RESULTS-cpu.md, stop 68).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

import pandas as pd

from ..planning import host_work

GOAL = 0.05  # a part misses when it is more than 5% from 1 (the accuracy a prediction aims for)
SPLIT_COLUMNS = ["predicted_step_ms", "step_ms", "draft_ms", "predicted_host_ms", "host_ms", "decode_tau",
                 "decode_speedup", "tau_part", "cost_part", "forward_part", "misses"]


def split(row: dict, info: dict, ar_step_ms: float, ar_host_ms: float = math.nan) -> dict:
    """The split columns of one tree row: `row` has the measured tau, speedup and ms per step (decode_tau and
    decode_step_ms where the summary has them, else tau and forward_ms), `info` is run.yaml's prediction of the tree
    (predicted_tau, predicted_speedup, predicted_step_ms, ar_step_ms, predicted_forward_ms), and `ar_step_ms` is
    ar's measured ms per step on the same turns, read the same way (`ar_host_ms`: its host work a step). NaN (and
    misses "-") where a number is missing: no profile, or a run.yaml from before predicted_step_ms (then cost_part
    is the speedup ratio over tau_part). `forward_part`: the verify forward alone against its price, in ar
    forwards (the profile's L(w) / L(1) over the measured step less its drafting and host work, over ar's step
    less its host work): where cost_part misses and forward_part misses alike, the curve missed, not the host
    work or the drafting."""
    step, tau = measured(row)
    pred_step, pred_ar = _num(info.get("predicted_step_ms")), _num(info.get("ar_step_ms"))
    tau_part = _ratio(tau, _num(info.get("predicted_tau")))
    cost_part = _ratio(_ratio(pred_step, pred_ar), _ratio(step, _num(ar_step_ms)))
    decode_speedup = tau * _ratio(_num(ar_step_ms), step)
    if math.isnan(cost_part):  # an older run.yaml: what the tau part leaves of the speedup's error
        cost_part = _ratio(_ratio(_num(row.get("speedup")), _num(info.get("predicted_speedup"))), tau_part)
    draft, host = parts(row)
    l1 = pred_ar - (_num(info.get("ar_host_ms")) if "ar_host_ms" in info else 0.0)  # the profile's L(1)
    verify = step - (0.0 if math.isnan(draft) else draft) - host
    forward_part = _ratio(_ratio(_num(info.get("predicted_forward_ms")), l1),
                          _ratio(verify, _num(ar_step_ms) - _num(ar_host_ms)))
    return {"predicted_step_ms": round(pred_step, 3), "step_ms": round(step, 3), "draft_ms": round(draft, 3),
            "predicted_host_ms": round(_num(info.get("predicted_host_ms")), 3), "host_ms": round(host, 3),
            "decode_tau": round(tau, 3), "decode_speedup": round(decode_speedup, 3), "tau_part": round(tau_part, 3),
            "cost_part": round(cost_part, 3), "forward_part": round(forward_part, 3),
            "misses": misses(tau_part, cost_part)}


def measured(row: dict) -> tuple[float, float]:
    """(ms per decode step, tokens per decode step) of a summary row; the prefill counted as a step where the row
    has no decode columns."""
    step, tau = _num(row.get("decode_step_ms")), _num(row.get("decode_tau"))
    if math.isnan(step) or math.isnan(tau):
        return _num(row.get("forward_ms")), _num(row.get("tau"))
    return step, tau


def parts(row: dict) -> tuple[float, float]:
    """(drafting ms, host ms) a decode step of a summary row (module docstring): its totals over its decode steps,
    (new_tokens - turns) / decode_tau; NaN where the row lacks them (a batched row, an older summary)."""
    steps = _ratio(_num(row.get("new_tokens")) - _num(row.get("turns")), _num(row.get("decode_tau")))
    if math.isnan(steps) or steps <= 0:
        return math.nan, math.nan
    host = _num(row.get("host_overhead")) * _num(row.get("wall_s"))
    return _num(row.get("draft_s")) * 1e3 / steps, host * 1e3 / steps


def misses(tau_part: float, cost_part: float) -> str:
    """Which part is more than GOAL from 1: "tau", "cost", "tau, cost", "neither", or "-" when unknown."""
    if math.isnan(tau_part) or math.isnan(cost_part):
        return "-"
    off = [name for name, part in (("tau", tau_part), ("cost", cost_part)) if abs(part - 1) > GOAL]
    return ", ".join(off) or "neither"


def ar_hosts(summary: pd.DataFrame) -> dict:
    """dataset -> ar's host ms a decode step (parts) in a batch-1 summary, where it has them."""
    if "host_overhead" not in summary:
        return {}
    return {r["dataset"]: parts(r)[1] for r in _ar_rows(summary)}


def ar_steps(summary: pd.DataFrame) -> dict:
    """dataset -> ar's measured ms per decode step (decode_step_ms; forward_ms in a summary without it) in a
    batch-1 summary."""
    if "forward_ms" not in summary and "decode_step_ms" not in summary:
        return {}
    return {r["dataset"]: measured(r)[0] for r in _ar_rows(summary)}


def _ar_rows(summary: pd.DataFrame) -> list[dict]:
    """ar's batch-1 rows of a summary."""
    ar = summary[(summary.method == "ar") & (summary.batch_size == 1 if "batch_size" in summary else True)]
    return ar.to_dict("records")


def lines(frame: pd.DataFrame, ar_host: dict | None = None, host_prices: list[str] | None = None) -> list[str]:
    """report.md's account of the split under the trees table: what the columns are, which part misses, and where
    a step cost misses, the measured step's parts beside ar's host work (`ar_host`: dataset -> ms, ar_hosts);
    `host_prices`: where each priced host work came from (run.yaml's trees' host_price), none when unpriced."""
    if "cost_part" not in frame or frame.cost_part.isna().all():
        return []
    md = ["`predicted_step_ms`: the prediction's ms per step (verify forward + drafting, the profile's clock); "
          "`step_ms`: measured, decode seconds / decode steps ((wall_s - ttft_s) / (target_forwards - 1): the "
          "prefill is not a step); `decode_tau`: tokens per decode step ((new_tokens - 1) / (target_forwards - 1)); "
          "`decode_speedup`: decode_tau x ar's step / step, the decode's speedup, which is what is predicted. "
          "decode_speedup / predicted_speedup = `tau_part` x `cost_part`: `tau_part` = decode_tau / predicted_tau "
          "(the acceptance file's estimate), `cost_part` = predicted step / measured step, each in ar steps "
          "(profile L(1), ar's "
          f"measured step): below 1 the step costs more than it was priced, above 1 less. The pricing controls "
          f"`cost_part`; the goal is within {GOAL:.0%} of 1. `misses` names the parts more than {GOAL:.0%} off. "
          "`forward_part`: the verify forward alone against its price, in ar forwards (the profile's L(w) / L(1) "
          "over the measured step less its drafting and host work / ar's step less its host work): a cost_part "
          "that misses with it is the latency curve's miss (the machine at another speed for wide forwards than "
          "when profiled), not the drafting's or the host work's. "
          "`draft_ms`, `host_ms`: the measured step's drafting and its host work outside the forwards and the "
          "drafting (masks, trees, top-k, acceptance), ms a decode step; the rest is the verify forward; "
          "`predicted_host_ms`: the host work priced into predicted_step_ms (ar's likewise into its L(1)). "
          + (f"Priced from this machine's earlier runs: {'; '.join(host_prices)}. " if host_prices else
             "No price here includes host work: no earlier run on this machine measured it (this run's figures are "
             "filed for the next: planning/host_work.py). ")
          + "These columns are also in tree_sizes.csv.", ""]
    known = frame[frame.misses != "-"]
    cost = known[known.misses.str.contains("cost")]
    tau = known[known.misses.str.contains("tau")]
    if len(known):
        md += [f"Step cost within {GOAL:.0%} for {len(known) - len(cost)} of {len(known)} tree row(s)"
               + (": misses for " + ", ".join(f"{r.method} on {r.dataset} (x{r.cost_part:.2f}"
                                              f"{_step_parts(r, (ar_host or {}).get(r.dataset))})"
                                              for r in cost.itertuples()) if len(cost) else "")
               + f"; tau within {GOAL:.0%} for {len(known) - len(tau)} of {len(known)}"
               + (": misses for " + ", ".join(f"{r.method} on {r.dataset} (x{r.tau_part:.2f})"
                                              for r in tau.itertuples()) if len(tau) else "") + ".", ""]
    md += _curve_line(cost)
    return md


def _curve_line(cost: pd.DataFrame) -> list[str]:
    """Where most step-cost misses are their verify forwards' (forward_part off by as much as cost_part): a line
    saying so and what to do, since neither the host work nor the drafting price can mend a stale curve."""
    if "forward_part" not in cost or not len(cost):
        return []
    curve = cost[(cost.forward_part - 1).abs() > GOAL]
    if len(curve) * 2 <= len(cost):
        return []
    return [f"The verify forward misses its price at {len(curve)} of the {len(cost)} step-cost misses "
            "(`forward_part`): the latency curve did, not the host work or the drafting. On a machine whose speed "
            "moves (a VM sharing its memory bandwidth), a profile taken in another sitting prices wide forwards "
            "against L(1) otherwise than they run now: `specbench profile` again right before the run (with "
            "--compile for a compiled run), or `specbench map --profile fresh`, takes the curve in the run's "
            "sitting.", ""]


def _step_parts(row, ar_host: float | None) -> str:
    """': a step of S ms = verify V + drafting D + host H (ar's A)' of a tree row, or '' without the parts."""
    step, draft, host = (_num(getattr(row, name, None)) for name in ("step_ms", "draft_ms", "host_ms"))
    if math.isnan(step) or math.isnan(host):
        return ""
    draft = 0.0 if math.isnan(draft) else draft
    ar = f" (ar's {ar_host:.2f})" if ar_host is not None and math.isfinite(ar_host) else ""
    forward = _num(getattr(row, "forward_part", None))
    curve = f"; its verify forward x{forward:.2f} of its price" if math.isfinite(forward) else ""
    return (f": a step of {step:.1f} ms = verify {step - draft - host:.1f} + drafting {draft:.2f} + host "
            f"{host:.2f}{ar}{curve}")


def _num(value) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out if math.isfinite(out) else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if not (math.isnan(a) or math.isnan(b)) and b > 0 else math.nan


def _chain_width(row: dict) -> float | None:
    """A chain method's mean verify width a decode step (1 + its draft tokens over its decode steps), where the
    row is one of a chain family's (pld, sd, pearl: planning/chain_plan.py prices them) and says it; else None."""
    from .. import families

    family = families.FAMILIES.get(row.get("method"))
    if family is None or family.kind not in ("draft-free", "draft-model") or family.shaped:
        return None
    steps = _ratio(_num(row.get("new_tokens")) - _num(row.get("turns")), _num(row.get("decode_tau")))
    width = 1.0 + _ratio(_num(row.get("drafted")), steps)
    return round(width, 3) if math.isfinite(width) else None


def host_points(summary: pd.DataFrame, meta: dict) -> dict[str, list[dict]]:
    """planning/host_work.py's key -> this run's points, one per dataset and method: (verify width, host ms a decode
    step over ar's forward ms a decode step: ar's step less its host work), of batch-1 rows the guard did not judge
    disturbed, a tree method's where run.yaml's prediction gave its verify width, a chain method's at its mean
    verify width (_chain_width), and ar's at width 1. Nothing for a sampled, synthetic or other engine's run (its
    host work is not a greedy step's of specbench's own loop)."""
    settings, env = meta.get("settings") or {}, meta.get("environment") or {}
    if (settings.get("temperature") or 0) > 0 or settings.get("synthetic_acceptance") or \
            settings.get("engine", "specbench") != "specbench" or "host_overhead" not in summary:
        return {}
    one = summary[summary.batch_size == 1] if "batch_size" in summary else summary
    if "timing" in one:  # a disturbed row's host work ran on shared cores
        one = one[~one.timing.astype(str).str.startswith("disturbed")]
    from ..core.model.naming import model_slug  # here: naming imports torch, which a report needs nowhere else

    spec = (meta.get("model") or {}).get("spec") or settings.get("model", "")
    here = (env.get("hardware", ""), model_slug(spec), env.get("dtype", ""), bool(settings.get("compile")))
    trees, when = meta.get("trees") or {}, datetime.now(timezone.utc).isoformat(timespec="seconds")
    out: dict[str, list[dict]] = {}
    for dataset, rows in one.groupby("dataset"):
        ar = rows[rows.method == host_work.AR].to_dict("records")
        ar_host = parts(ar[0])[1] if ar else math.nan
        ar_forward = _num(ar[0].get("decode_step_ms")) - ar_host if ar else math.nan
        if not ar_forward > 0:  # NaN too: no ar row, or no decode columns
            continue
        points = [(host_work.AR, 1.0, ar_host, host_work.AR)]
        for r in rows[rows.method != host_work.AR].to_dict("records"):
            info = trees.get(r["method"]) or {}
            if info.get("verify_width") is not None and info.get("family"):
                points.append((info["family"], float(info["verify_width"]), parts(r)[1], r["method"]))
            elif (width := _chain_width(r)) is not None:
                points.append((r["method"], width, parts(r)[1], r["method"]))
        for family, width, host, label in points:
            if math.isfinite(host):
                out.setdefault(host_work.key(*here, family), []).append(
                    {"width": width, "ratio": round(host / ar_forward, 5), "label": label, "dataset": dataset,
                     "when": when, "git": env.get("git")})  # the code that paid it: a later one may pay less
    return out

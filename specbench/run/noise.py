"""The noise guard: was the machine quiet while a row was timed, and are a run's speedups physically possible?

Two defences, both written into records.csv / summary.csv and the report:
1. Per timed row, what else the machine did (Linux /proc): the CPU time other processes used (in cores' worth:
   machine-wide busy time minus this process's own), the share the hypervisor stole, and the 1-minute load average
   before and after. A row is *disturbed* when others used more than FOREIGN_CPU_LIMIT cores or steal exceeded
   STEAL_LIMIT.
2. Per method x dataset, a plausibility bound. speedup = tau x (ar's time per forward / the method's time per
   forward), and a method's forward is at least as wide as ar's one-token forward, so its time per forward cannot
   be below ar's by more than the latency curve allows: floor = min_n L(n) / L(1) from this hardware's profile
   (1.0 without one; a curve can dip, e.g. Zen 4 fp32 L(4) < L(1)). A speedup above tau / floor x (1 + tolerance)
   means the timings of ar and the method were taken under different conditions.
A run whose rows are disturbed, or whose speedups break the bound, is marked "disturbed" with the advice to re-run
on a quiet machine with --repeats 3; `report --fail-below` refuses to pass or fail on it without saying so.
"""

from __future__ import annotations

import pandas as pd

from ..core.contention import FOREIGN_CPU_LIMIT, STEAL_LIMIT  # per-row readings: core/contention.py

DISTURBED_SHARE = 0.10  # a method x dataset is disturbed when more of its (or ar's) rows than this are
BOUND_TOLERANCE = 0.10  # timing noise allowed on top of the plausibility bound
ADVICE = ("re-run on a quiet machine (stop other jobs; `uptime` load near 0) with --repeats 3, which keeps the "
          "median of 3 timings per prompt turn")


def latency_floor(profile) -> float:
    """min_n L(n) / L(1) on this hardware's profile (every KV length), capped at 1; 1.0 without a profile."""
    if profile is None:
        return 1.0
    ratios = [min(c["median_ms"]) / c["median_ms"][0] for c in profile.curves.values() if c["median_ms"][0] > 0]
    return round(min(ratios + [1.0]), 4)


def judge(summary: pd.DataFrame, records: pd.DataFrame, floor: float | None = 1.0) -> pd.DataFrame:
    """The summary (report.summarize: speedup, tau, forward_ms, forward_ratio per method x dataset) with the noise
    guard's columns added: speedup_bound (tau / floor x (1 + tolerance); NaN and not applied when floor is None:
    batch > 1, whose baseline is batched ar), disturbed_rows (the share of its own or ar's rows timed beside other
    work) and `timing`: "ok" or "disturbed: <reasons>"."""
    disturbed = _disturbed_rows(records)
    bounds, shares, timings = [], [], []
    for r in summary.itertuples(index=False):
        mine = (records.method == r.method) & (records.dataset == r.dataset)
        ar = (records.method == "ar") & (records.dataset == r.dataset)
        bound = r.tau / floor * (1 + BOUND_TOLERANCE) if floor else float("nan")
        share = max(disturbed[mine].mean(), disturbed[ar].mean() if ar.any() else 0.0)
        reasons = []
        if r.method != "ar" and r.speedup > bound:
            reasons.append(f"speedup {r.speedup:.2f}x exceeds what tau {r.tau:.2f} allows ({bound:.2f}x): its "
                           f"forwards took {r.forward_ms:.1f} ms against ar's {r.forward_ms / r.forward_ratio:.1f} ms")
        if share > DISTURBED_SHARE:
            reasons.append(f"{share:.0%} of its or ar's rows were timed while other processes used up to "
                           f"{records.loc[mine | ar, 'foreign_cpu'].max():.2f} cores")
        bounds.append(round(bound, 3))
        shares.append(round(float(share), 3))
        timings.append("disturbed: " + "; ".join(reasons) if reasons else "ok")
    return summary.assign(speedup_bound=bounds, disturbed_rows=shares, timing=timings)


def is_disturbed(timing) -> bool:
    """Whether a summary's `timing` cell is the guard's "disturbed: ..." verdict."""
    return str(timing).startswith("disturbed")


def _disturbed_rows(records: pd.DataFrame) -> pd.Series:
    """Per record: was the machine busy with something else while it was timed (False for older runs)."""
    if "foreign_cpu" not in records:
        return pd.Series(False, index=records.index)
    foreign = pd.to_numeric(records.foreign_cpu, errors="coerce").fillna(0)
    steal = pd.to_numeric(records.get("steal", 0), errors="coerce").fillna(0)
    return (foreign > FOREIGN_CPU_LIMIT) | (steal > STEAL_LIMIT)

"""The noise guard: was the machine quiet while a row was timed, and are a run's speedups physically possible?

Three defences, all written into records.csv / summary.csv and the report:
1. Per timed row, what else the machine did (Linux /proc): the CPU time other processes used (in cores' worth:
   machine-wide busy time minus this process's own), the share the hypervisor stole, and the 1-minute load average
   before and after. A row is *disturbed* when others used more than FOREIGN_CPU_LIMIT cores or steal exceeded
   STEAL_LIMIT.
2. Per row, an outlier test that needs no /proc (a cloud VM's counters may not show other tenants): a row whose
   forward time is far above its method's median (same dataset, batch size and batching, in this run), and slower
   than the other labels of the same prompt turn are (every label of the turn: ar and both batching modes), is
   disturbed too (`outliers`). A forward's time follows its width (a `pld` forward verifies its draft, 1 to 11
   tokens), so a row is judged both per forward and per token verified and counts as slow only when it is slow
   both ways (`slowness`): the two bracket any latency curve that rises with width no faster than linearly, so a
   genuinely wide, fast row is not flagged while a disturbed one (slow both ways) still is.
3. Per method x dataset, a plausibility bound. speedup = tau x (ar's time per forward / the method's time per
   forward), and a method's forward is at least as wide as ar's one-token forward, so its time per forward cannot
   be below ar's by more than the latency curve allows: floor = min_n L(n) / L(1) from this hardware's profile
   (1.0 without one; a curve can dip, e.g. Zen 4 fp32 L(4) < L(1)). A speedup above tau / floor x (1 + tolerance)
   means the timings of ar and the method were taken under different conditions.
The guard judges by time, not by rows: every aggregate weighs a row by its timed seconds, so one slowed prompt can
carry a quarter of ar's time while being a tenth of its rows. A method x dataset is disturbed when more
than DISTURBED_SHARE of its own or ar's timed seconds were disturbed, or its speedup breaks the bound.
`specbench run --retime N` re-times disturbed prompt turns before writing them (retime.py); what stays disturbed
is flagged here, and `report --fail-below` / `--fail-regression` refuse to pass or fail on it without saying so.
"""

from __future__ import annotations

import math
import statistics

import pandas as pd

from ..core.machine.contention import FOREIGN_CPU_LIMIT, STEAL_LIMIT  # per-row readings: core/machine/contention.py
from .shard import sibling_note

DISTURBED_SHARE = 0.10  # a method x dataset is disturbed when more of its (or ar's) timed seconds than this are
BOUND_TOLERANCE = 0.10  # timing noise allowed on top of the plausibility bound
# Outlier test. On a quiet machine one method's time per forward varies over a dataset's turns by prompt length
# (prefill and KV length) and drafting work, far less than a neighbour that takes half the cores slows it
# (docs/measurement.md has both spreads); OUTLIER_FACTOR sits between the two. A median needs 3 rows
# to stand for the method rather than for the slow row itself. A turn whose every method is slow (a long prompt) is
# not an outlier: a row must also be OUTLIER_FACTOR slower than the turn's other methods are.
OUTLIER_FACTOR = 1.5
OUTLIER_MIN_ROWS = 3
ADVICE = ("re-run on a quiet machine (stop other jobs; `uptime` load near 0) with --repeats 3 and --retime 2, which "
          "keep the median of 3 timings per prompt turn and re-time turns that ran beside other work")
# A turn is every label that decoded it, batching modes together: with --batching both, `ar` runs in one mode only,
# and a padded row keyed apart from it would lose the "every label was slow on this turn" exemption.
TURN_KEY = ["dataset", "prompt_id", "turn", "batch_size"]
GROUP_KEY = ["method", "dataset", "batch_size", "batching"]  # "same method at that width / batch in this run"


def latency_floor(profile) -> float:
    """min_n L(n) / L(1) on this hardware's profile (every KV length), capped at 1; 1.0 without a profile."""
    if profile is None:
        return 1.0
    ratios = [min(c["median_ms"]) / c["median_ms"][0] for c in profile.curves.values() if c["median_ms"][0] > 0]
    return round(min(ratios + [1.0]), 4)


def width(drafted, target_forwards) -> float:
    """Tokens one target forward verified, on average: 1 + drafted / forwards (ar and a method that drafted nothing:
    1; a tree method: its tree's size, the same every forward)."""
    try:
        value = 1.0 + float(drafted) / max(float(target_forwards), 1.0)
    except (TypeError, ValueError):
        return 1.0
    return value if math.isfinite(value) and value >= 1 else 1.0


def slowness(forward_ms: float, reference, wide: float = 1.0) -> float:
    """How slow one forward was against its method's other rows `reference` ((forward_ms, width) pairs, or bare
    forward_ms at width 1): the smaller of forward_ms / their median forward_ms and (forward_ms / wide) / their
    median per token verified. A width costs between nothing (memory-bound) and its tokens (compute-bound), so the
    smaller ratio is the slowness that no latency curve between the two explains. NaN with fewer than
    OUTLIER_MIN_ROWS reference rows or an unknown forward."""
    pairs = [(float(x[0]), float(x[1])) if isinstance(x, (tuple, list)) else (float(x), 1.0)
             for x in reference if x is not None]
    pairs = [(f, w) for f, w in pairs if math.isfinite(f) and f > 0 and math.isfinite(w) and w >= 1]
    if len(pairs) < OUTLIER_MIN_ROWS or forward_ms is None or not math.isfinite(forward_ms):
        return math.nan
    per_forward = forward_ms / statistics.median(f for f, _ in pairs)
    per_token = (forward_ms / max(wide, 1.0)) / statistics.median(f / w for f, w in pairs)
    return min(per_forward, per_token)


def outliers(slow: dict) -> set:
    """Of one prompt turn's rows (key -> slowness()), those slower than OUTLIER_FACTOR x their method's median and
    than OUTLIER_FACTOR x the turn's other rows' median slowness (a long prompt slows every method alike)."""
    known = {k: s for k, s in slow.items() if math.isfinite(s)}
    out = set()
    for key, s in known.items():
        others = [v for k, v in known.items() if k != key]
        if s > OUTLIER_FACTOR * max(1.0, statistics.median(others) if others else 1.0):
            out.add(key)
    return out


def flag_rows(records: pd.DataFrame) -> pd.DataFrame:
    """Records with `row_outlier` (the outlier test) and `row_disturbed` (bool): its /proc reading, the outlier
    test, or the run's own verdict (`timing_disturbed`, written when --retime could not heal it). Idempotent: an
    existing flag is kept, so that per-category summaries judge a row as the overall one does."""
    if "row_disturbed" in records:
        return records
    flag = _busy_rows(records)
    if "timing_disturbed" in records:
        flag |= records.timing_disturbed.astype(str).str.lower().isin(["true", "1"])
    outlier = _outlier_rows(records)
    return records.assign(row_outlier=outlier, row_disturbed=flag | outlier)


def judge(summary: pd.DataFrame, records: pd.DataFrame, floor: float | None = 1.0) -> pd.DataFrame:
    """The summary (report/summary.summarize: speedup, tau, forward_ms, forward_ratio per method x dataset) with the noise
    guard's columns added: speedup_bound (tau / floor x (1 + tolerance); NaN and not applied when floor is None:
    batch > 1, whose baseline is batched ar), disturbed_time (the share of its own or ar's timed seconds that were
    disturbed) and `timing`: "ok" or "disturbed: <reasons>"."""
    records = flag_rows(records)
    bounds, shares, timings = [], [], []
    for r in summary.itertuples(index=False):
        mine = (records.method == r.method) & (records.dataset == r.dataset)
        ar = (records.method == "ar") & (records.dataset == r.dataset)
        bound = r.tau / floor * (1 + BOUND_TOLERANCE) if floor else float("nan")
        share = max(_time_share(records[mine]), _time_share(records[ar]) if ar.any() else 0.0)
        reasons = []
        if r.method != "ar" and r.speedup > bound:
            reasons.append(f"speedup {r.speedup:.2f}x exceeds what tau {r.tau:.2f} allows ({bound:.2f}x): its "
                           f"forwards took {r.forward_ms:.1f} ms against ar's {r.forward_ms / r.forward_ratio:.1f} ms")
        if share > DISTURBED_SHARE:
            reasons.append(f"{share:.0%} of its or ar's timed seconds ran disturbed ({_how(records[mine | ar])})")
        bounds.append(round(bound, 3))
        shares.append(round(float(share), 3))
        # sibling shards are planned (not disturbed) but share the memory bandwidth: said, not hidden (shard.py)
        timings.append(("disturbed: " + "; ".join(reasons) if reasons else "ok") + sibling_note(records[mine | ar]))
    return summary.assign(speedup_bound=bounds, disturbed_time=shares, timing=timings)


def is_disturbed(timing) -> bool:
    """Whether a summary's `timing` cell is the guard's "disturbed: ..." verdict."""
    return str(timing).startswith("disturbed")


def _time_share(rows: pd.DataFrame) -> float:
    """The share of these rows' timed seconds that were disturbed (0 without seconds)."""
    wall = pd.to_numeric(rows.wall_s, errors="coerce").fillna(0)
    return float(wall[rows.row_disturbed].sum() / wall.sum()) if wall.sum() > 0 else 0.0


def _how(rows: pd.DataFrame) -> str:
    """Why the disturbed rows among `rows` were: other processes' CPU and / or slow forwards."""
    bad = rows[rows.row_disturbed]
    foreign = pd.to_numeric(bad.get("foreign_cpu", pd.Series(dtype=float)), errors="coerce").max()
    said = [f"other processes used up to {foreign:.2f} cores"] if foreign > FOREIGN_CPU_LIMIT else []
    if "row_outlier" in bad and bad.row_outlier.any():
        said.append(f"{int(bad.row_outlier.sum())} row(s) over {OUTLIER_FACTOR}x their method's median forward time")
    return "; ".join(said) or "marked disturbed by the run"


def _busy_rows(records: pd.DataFrame) -> pd.Series:
    """Per record: was the machine busy with something else while it was timed (False for older runs)."""
    if "foreign_cpu" not in records:
        return pd.Series(False, index=records.index)
    foreign = pd.to_numeric(records.foreign_cpu, errors="coerce").fillna(0)
    steal = pd.to_numeric(records.get("steal", 0), errors="coerce").fillna(0)
    return (foreign > FOREIGN_CPU_LIMIT) | (steal > STEAL_LIMIT)


def _outlier_rows(records: pd.DataFrame) -> pd.Series:
    """Per record: the outlier test against its method's medians over the whole run (all its rows at that dataset,
    batch size and batching), per forward and per token verified (slowness). Records without forward_ms take
    wall_s / target_forwards; without drafted, width 1."""
    frame = records.assign(batch_size=records.get("batch_size", 1), batching=records.get("batching", "-"))
    for col in ("batch_size", "batching"):  # older runs: blank cells
        frame[col] = frame[col].astype(str).replace({"": "1" if col == "batch_size" else "-", "nan": "-"})
    fwd = pd.to_numeric(frame.get("forward_ms", pd.Series(math.nan, index=frame.index)), errors="coerce")
    forwards = pd.to_numeric(frame.target_forwards, errors="coerce").clip(lower=1)
    fallback = 1e3 * pd.to_numeric(frame.wall_s, errors="coerce") / forwards
    frame["fwd"] = fwd.fillna(fallback)
    drafted = pd.to_numeric(frame.get("drafted", pd.Series(0, index=frame.index)), errors="coerce").fillna(0)
    frame["tok"] = frame.fwd / (1 + drafted.clip(lower=0) / forwards.fillna(1))  # ms per token verified

    def median(s: pd.Series) -> pd.Series:
        return s.groupby([frame[k] for k in GROUP_KEY], sort=False).transform(
            lambda g: g.median() if g.notna().sum() >= OUTLIER_MIN_ROWS else math.nan)

    frame["slow"] = pd.concat([frame.fwd / median(frame.fwd), frame.tok / median(frame.tok)], axis=1).min(
        axis=1, skipna=False)
    flagged = pd.Series(False, index=records.index)
    for _, turn in frame.groupby(TURN_KEY, sort=False):
        for index in outliers(dict(zip(turn.index, turn.slow))):
            flagged[index] = True
    return flagged

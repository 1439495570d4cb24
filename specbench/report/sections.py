"""report.md's sections that sit beside the summary table: the noise guard's account, the per-category table,
trees measured vs predicted (the error's split: prediction_split.py), and whether the run is partial."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..run import noise
from . import prediction_split
from .compact import timing_word
from .markdown import markdown_table
from .plots import plot_bars, plot_tree_sizes
from .summary import by_category, disturbed, row_name


def noise_section(summary: pd.DataFrame, meta: dict, records: pd.DataFrame | None = None) -> list[str]:
    """The report's account of how far the timings can be trusted (noise.py), and what --retime healed."""
    guard = meta.get("noise_guard") or {}
    md = ["## Timing check (noise guard)", "",
          f"Each row records the CPU time other processes used while it was timed (`foreign_cpu`, cores; a "
          f"sharded run's other shards are recorded apart as `sibling_cpu`), the hypervisor's steal and the load average. A row is disturbed when it ran beside more than "
          f"{noise.FOREIGN_CPU_LIMIT} cores of other work (or {noise.STEAL_LIMIT:.0%} steal), or when its time per "
          f"forward is over {noise.OUTLIER_FACTOR}x its method's median (at least {noise.OUTLIER_MIN_ROWS} rows) "
          "and beyond the same turn's other methods (no /proc needed). A method x dataset is disturbed when over "
          f"{noise.DISTURBED_SHARE:.0%} of its or ar's timed seconds were (`disturbed_time`), or when its speedup "
          f"exceeds tau / floor x {1 + noise.BOUND_TOLERANCE:.2f}, floor = min L(n) / L(1) = "
          f"{guard.get('latency_floor', 1.0)} "
          f"({'profile ' + guard['profile'] if guard.get('profile') else 'no profile of this hardware: 1.0'}). "
          "Methods run in an order rotated per prompt, so a burst of load does not land on one method only. "
          "`speedup_lo` - `speedup_hi` is a 95% bootstrap interval of the speedup (prompts resampled, batches at B > 1; seeded), "
          "`speedup_median` the median per-turn ratio: how much single turns move the number.", ""]
    md += retime_lines(records, (meta.get("settings") or {}).get("retime"))
    bad = disturbed(summary)
    if len(bad):
        md += ["**TIMING DISTURBED**: these numbers are not trustworthy; " + noise.ADVICE + ".", ""]
        md += [f"- {row_name(r)} on {r.dataset}: {r.timing}" for r in bad.itertuples(index=False)] + [""]
    else:
        md += ["All rows: timing ok.", ""]
    return md


def retime_lines(records: pd.DataFrame | None, retime) -> list[str]:
    """What `run --retime N` did: prompt turns re-timed, and how many stayed disturbed."""
    if records is None or "timing_tries" not in records:
        return []
    turns = records.assign(tries=pd.to_numeric(records.timing_tries, errors="coerce").fillna(1),
                           stayed=records.timing_disturbed.astype(str).str.lower().isin(["true", "1"]))
    turns = turns.groupby(["dataset", "prompt_id", "turn"]).agg(tries=("tries", "max"), stayed=("stayed", "any"))
    retimed, healed = int((turns.tries > 1).sum()), int(((turns.tries > 1) & ~turns.stayed).sum())
    said = f"--retime {retime}: " if retime is not None else ""
    return [f"{said}{retimed} of {len(turns)} prompt turn(s) re-timed, {healed} of them healed (a quiet timing "
            f"kept); {int(turns.stayed.sum())} turn(s) left disturbed (`timing_disturbed`; `timing_tries` per "
            "record).", ""]


def category_section(records: pd.DataFrame, summary: pd.DataFrame, run_dir: Path, latency_floor: float) -> list[str]:
    """report.md's per-category table (and summary_by_category.csv), when the prompts have categories."""
    table = by_category(records, summary, latency_floor)
    if table.empty:
        return []
    table.to_csv(run_dir / "summary_by_category.csv", index=False)
    plot_by_category(table, run_dir / "speedup_by_category.png")
    return ["## Per category", "", markdown_table(table), "",
            "Each category's speedup is against `ar` on the same category's prompts; `all` is the overall row "
            "(`summary_by_category.csv`, plotted in `speedup_by_category.png`). `specbench run --per-category "
            "--limit N` takes N prompts of each.", ""]


def plot_by_category(table: pd.DataFrame, path: Path) -> None:
    """speedup_by_category.png: one group of bars per category (dataset/category when the run has several datasets,
    `all` last), one bar per method other than `ar`, as Spec-Bench's leaderboard shows its categories."""
    rows = table[table.method != "ar"]
    if rows.empty:
        return
    several = rows.dataset.nunique() > 1
    group = [f"{d}/{c}" if several else str(c) for d, c in zip(rows.dataset, rows.category)]
    plot_bars(rows.assign(dataset=group), "speedup", "speedup over ar\n(total tokens / total time)", path,
              baseline=1.0, title="speedup by category")


def is_partial(meta: dict) -> bool:
    """An interrupted run (run.yaml written by a specbench that records completion, and not complete)."""
    return meta.get("complete") is False


def tree_section(summary: pd.DataFrame, trees: dict, run_dir: Path, title: str = "") -> list[str]:
    """Tree methods: measured vs predicted tau and speedup per tree (PPD Fig. 8c when a run swept sizes), with
    tree_sizes.png for a sweep; the ms per step predicted and measured, and the speedup's error split into its tau
    and step-cost parts (prediction_split.py; batch-1 rows)."""
    rows = []
    ar_ms, ar_host = prediction_split.ar_steps(summary), prediction_split.ar_hosts(summary)
    for label, info in trees.items():
        for _, r in summary[summary.method == label].iterrows():
            one = getattr(r, "batch_size", 1) == 1  # the split's identity holds for one sequence at a time
            rows.append({"method": label, "dataset": r.dataset, "size": info.get("size"),
                         "predicted_tau": info.get("predicted_tau"), "tau": r.tau,
                         "predicted_speedup": info.get("predicted_speedup"), "speedup": r.speedup,
                         "speedup_lo": getattr(r, "speedup_lo", None), "speedup_hi": getattr(r, "speedup_hi", None),
                         **prediction_split.split(r.to_dict() if one else {}, info, ar_ms.get(r.dataset),
                                                  ar_host.get(r.dataset, math.nan)),
                         "timing": getattr(r, "timing", "")})
    if not rows:
        return []
    frame = pd.DataFrame(rows).sort_values(["dataset", "size"])
    frame.to_csv(run_dir / "tree_sizes.csv", index=False)
    profile = next((i.get("profile") for i in trees.values() if i.get("profile")), None)
    kv = next((i.get("kv_length") for i in trees.values() if i.get("kv_length")), None)
    if profile and kv:  # planning/context_prediction.py: read at the run's mean context
        profile = f"{profile} at KV {kv} (the run's mean context)"
    sources = list(dict.fromkeys(i.get("acceptance") for i in trees.values() if i.get("acceptance")))
    acceptance = next((a for a in sources if a.startswith("a generic")), sources[0] if sources else None)
    shown = frame.assign(timing=frame.timing.map(timing_word))
    md = ["## Trees: measured vs predicted", "", markdown_table(shown), "",
          f"Predicted tau from {', '.join(sources) or 'the acceptance table'} (each method's own); predicted speedup from the latency profile "
          f"{profile or '(none for this hardware: run `specbench profile`)'}.", ""]
    if acceptance and acceptance.startswith("a generic"):
        md[-2:-1] = [f"**Predicted tau is not this model's**: it comes from {acceptance}; predicted speedup "
                     f"likewise. Profile: {profile or 'none for this hardware (run `specbench profile`)'}."]
    priced = list(dict.fromkeys(f"{i.get('family') or label}: {i['host_price']}" for label, i in trees.items()
                                if i.get("host_price")))  # one line a family: its labels share the law
    md += prediction_split.lines(frame, ar_host, priced)
    if frame["size"].nunique() >= 2:
        plot_tree_sizes(frame, run_dir / "tree_sizes.png", title)
        md += ["![speedup per tree size](tree_sizes.png)", ""]
    return md

"""The map's files and report.md section: map.csv (map_table.COLUMNS), map.png (per-user tokens/s against total
throughput per method, one point per batch size, measured solid and predicted dashed, the break-even named in the
legend) and the section "Where each method pays", written for any run with two or more batch sizes."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from . import map_table  # noqa: E402
from .markdown import markdown_table  # noqa: E402
from .titles import set_title  # noqa: E402

TOLERANCE = map_table.GOAL  # the cost model's goal: predicted within 10% of measured
MS = "{:.1f}"


def write(run_dir: Path, records: pd.DataFrame, summary: pd.DataFrame, meta: dict, title: str) -> list[str]:
    """map.csv, map.png and the report section's lines ([] for a run without a batch-size sweep)."""
    if not map_table.has_sweep(records):
        return []
    profile, source = map_table.run_profile(run_dir, meta)
    drafter = map_table.drafter_profile(run_dir) if profile is not None else None
    frame = map_table.table(records, summary, meta, profile, drafter)
    if frame.empty:
        return []
    frame.to_csv(Path(run_dir) / "map.csv", index=False)
    plot(frame, Path(run_dir) / "map.png", title)
    if profile is not None and drafter is not None:
        source += f"; a drafter's forwards from {map_table.DRAFT_COPY} (measured beside it on the drafter's engines)"
    return section(frame, source if profile is not None else None, source)


def _fmt(value, pattern: str = "{:.2f}") -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else pattern.format(value)


def section(frame: pd.DataFrame, profile_source: str | None, why_not: str) -> list[str]:
    md = ["## Where each method pays (map)", "",
          "Decode throughput of the whole batch at each batch size B (the prefill is not a step), measured, beside "
          "the cost model's prediction: each batch runs as long as its longest sample, so its steps are the "
          "expected maximum over its samples of a seeded simulation of their accepted lengths (drawn from the "
          "run's per-position acceptance), each step priced at L(rows still decoding, w) + drafting + host work per "
          "row, with the mean verify width w as this run verified it; a drafter model's drafting is priced on its "
          "own curve L_d(rows, w) (its forwards per step over the rows still drafting) plus its drafting host work "
          "a step as batch 1 measured it (`draft_host_ms`), other drafting as this run measured it, host work per "
          "row as batch 1 measured it (planning/batch_prediction.py). "
          "`steps err`: predicted batch steps over measured; `step cost err`: predicted ms per batch step over "
          "measured (host work outside the forward shows here); the tok/s error is "
          "1 / ((1 + steps err)(1 + step cost err)) - 1. `break-even`: the B where the method's speedup over `ar` "
          "at the same B falls through 1 (interpolated on log2 B); `per user`: each sample's decode tokens/s.", ""]
    md += [f"Profile: {profile_source}." if profile_source else f"No prediction: {why_not}.", ""]
    shown = pd.DataFrame({
        "dataset": frame.dataset, "method": frame.method, "B": frame.batch_size, "setting": frame.setting,
        "width": frame.width.map(lambda v: _fmt(v)), "tau": frame.tau.map(lambda v: _fmt(v)),
        "predicted tok/s": frame.predicted_tok_s.map(lambda v: _fmt(v)),
        "measured tok/s": frame.measured_tok_s.map(lambda v: _fmt(v)),
        "error": frame.error.map(lambda v: _fmt(v, "{:+.0%}")),
        f"within {TOLERANCE:.0%}": [("yes" if w else "no") if math.isfinite(e) else "-"
                                    for w, e in zip(frame.within_goal, frame.error.astype(float))],
        "steps err": frame.steps_error.map(lambda v: _fmt(v, "{:+.0%}")),
        "step cost err": frame.step_cost_error.map(lambda v: _fmt(v, "{:+.0%}")),
        "step ms pred (fwd + draft + host) / meas": [
            f"{_fmt(t, MS)} ({_fmt(f, MS)} + {_fmt(d, MS)} + {_fmt(h, MS)}) / {_fmt(m, MS)}"
            for t, f, d, h, m in zip(frame.step_ms_predicted, frame.forward_ms_predicted, frame.draft_ms_predicted,
                                     frame.host_ms_predicted, frame.step_ms_measured)],
        "speedup measured": frame.measured_speedup.map(lambda v: _fmt(v, "{:.2f}x")),
        "speedup predicted": frame.predicted_speedup.map(lambda v: _fmt(v, "{:.2f}x")),
        "per user tok/s": frame.per_user_tok_s.map(lambda v: _fmt(v)), "timing": frame.timing})
    md += [markdown_table(shown), ""]
    methods = frame[frame.method != "ar"].drop_duplicates(["dataset", "method"])
    if len(methods):
        md += ["Break-even batch size, measured and predicted:", "",
               markdown_table(pd.DataFrame({"dataset": methods.dataset, "method": methods.method,
                                            "measured": methods.break_even,
                                            "predicted": methods.break_even_predicted})), ""]
    best = frame[frame.best_at_batch & (frame.method != "ar")]
    if best.method.str.contains("@").any() or best.setting.ne("").any():
        md += ["The best setting per batch size (the schedule a serving engine would want):", "",
               markdown_table(pd.DataFrame({"dataset": best.dataset, "B": best.batch_size, "method": best.method,
                                            "setting": best.setting,
                                            "speedup": best.measured_speedup.map(lambda v: _fmt(v, "{:.2f}x"))})),
               ""]
    md += _accuracy_lines(frame) + ["![map](map.png)", ""]
    return md


def _accuracy_lines(frame: pd.DataFrame) -> list[str]:
    """How many points the prediction got within TOLERANCE, and the worst misses."""
    errors = frame.dropna(subset=["error"])
    if errors.empty:
        return []
    within = errors[errors.error.abs() <= TOLERANCE]
    lines = [f"Prediction within {TOLERANCE:.0%} of measured at {len(within)} of {len(errors)} points "
             f"(mean |error| {errors.error.abs().mean():.0%})."]
    if len(within):
        lines[0] += " Within: " + ", ".join(f"{r.method} B={r.batch_size}" for r in within.itertuples()) + "."
    split = errors.dropna(subset=["steps_error", "step_cost_error"])
    if len(split):
        lines[0] += (f" Mean |steps err| {split.steps_error.abs().mean():.0%}, mean |step cost err| "
                     f"{split.step_cost_error.abs().mean():.0%}.")
    worst = errors.reindex(errors.error.abs().sort_values(ascending=False).index).head(3)
    worst = worst[worst.error.abs() > TOLERANCE]
    if len(worst):
        lines[0] += " Largest misses: " + "; ".join(
            f"{r.method} B={r.batch_size} {r.error:+.0%}" for r in worst.itertuples()) + "."
    return lines + [""]


def plot(frame: pd.DataFrame, path: Path, title: str) -> None:
    """Per-user tokens/s against total tokens/s, a line per method through its batch sizes (each point labelled B);
    predicted dashed in the same colour; one panel per dataset."""
    datasets = list(dict.fromkeys(frame.dataset))
    fig, axes = plt.subplots(1, len(datasets), figsize=(6.5 * len(datasets), 4.8), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        part = frame[frame.dataset == dataset]
        for i, (label, g) in enumerate(part.groupby("method", sort=False)):
            g = g.sort_values("batch_size")
            colour = f"C{i % 10}"
            be = g.break_even.iloc[0]
            name = label if label == "ar" or not be else f"{label} (break-even {be})"
            ax.plot(g.measured_tok_s, g.per_user_tok_s, "o-", color=colour, label=name)
            for r in g.itertuples():
                ax.annotate(f"B={r.batch_size}", (r.measured_tok_s, r.per_user_tok_s), fontsize=7,
                            textcoords="offset points", xytext=(3, 3))
            if g.predicted_tok_s.notna().any():
                ax.plot(g.predicted_tok_s, g.predicted_tok_s / g.batch_size, "x--", color=colour, alpha=0.6)
        ax.set_xlabel("total decode tokens/s (whole batch)")
        ax.set_ylabel("tokens/s per user")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, title="solid: measured, dashed: predicted", title_fontsize=7)
        set_title(ax, f"{title}, {dataset}", 6.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""Per-step timelines of the draft-model methods: when the drafter and the target were busy, and the mutual waiting
that PEARL sets out to remove (PEARL §3.1, Fig. 1 and 3; App. D.3 times each component of a step).

A step is one dict (made by core.concurrency.step, stored in Generation.timeline, saved by the runner as
timeline.jsonl):
  mode       sd | pre | post | draft (pearl-no-pre's lone drafting) | verify (pearl-no-post's lone verification)
  t0, t1     step start and end, seconds since the generation started
  draft      [start, end] of the drafter's busy span, or null;  target: the same for the target
  checked    draft tokens the target checked; accepted: of those, kept; emitted: tokens the step appended
  sampled    1 when the step ended with a token sampled from the target (a correction or bonus token)

Definitions used in reports:
  target idle  = step time - target busy;  drafter idle = step time - drafter busy;  mutual waiting = their sum
  mean accepted tokens (PEARL §4.4.2) = emitted tokens / target-sampled tokens: the tokens of one drafting run,
  from one target-sampled token to the next, whatever the number of consecutive post-verify rounds it spans
  (for sd it equals tau).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .markdown import markdown_table  # noqa: E402

TIMELINE_FILE = "timeline.jsonl"
COLORS = {"sd": "#777777", "pre": "#4c72b0", "post": "#55a868", "draft": "#c44e52", "verify": "#8172b2"}


def totals(steps: list[dict]) -> dict:
    """Busy, idle and overlap seconds of one generation, and its mean accepted tokens."""
    def busy(span):
        return 0.0 if span is None else span[1] - span[0]

    wall = sum(s["t1"] - s["t0"] for s in steps)
    draft = sum(busy(s["draft"]) for s in steps)
    target = sum(busy(s["target"]) for s in steps)
    overlap = sum(max(0.0, min(s["draft"][1], s["target"][1]) - max(s["draft"][0], s["target"][0]))
                  for s in steps if s["draft"] and s["target"])
    emitted = sum(s["emitted"] for s in steps)
    runs = sum(s["sampled"] for s in steps) + (1 if steps and not steps[-1]["sampled"] else 0)
    return {"steps": len(steps), "step_s": wall, "draft_busy_s": draft, "target_busy_s": target,
            "target_idle_s": wall - target, "draft_idle_s": wall - draft,
            "mutual_wait_s": (wall - target) + (wall - draft), "overlap_s": overlap,
            "mean_accepted_tokens": emitted / runs if runs else float("nan")}


def append(run_dir: Path, key: dict, steps: list[dict]) -> None:
    """Add one generation's steps to timeline.jsonl (key: method, dataset, prompt_id, turn)."""
    with open(Path(run_dir) / TIMELINE_FILE, "a") as f:
        f.write(json.dumps({**key, "steps": steps}) + "\n")


def read(run_dir: Path) -> list[dict]:
    """The rows of timeline.jsonl (the last one wins for a key written twice by a resumed run)."""
    path = Path(run_dir) / TIMELINE_FILE
    if not path.exists():
        return []
    rows: dict[tuple, dict] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows[(row["method"], row["dataset"], str(row["prompt_id"]), row["turn"])] = row
    return list(rows.values())


def summarize(rows: list[dict]) -> pd.DataFrame:
    """One row per method x dataset: seconds busy / idle, mutual waiting, overlap, mean accepted tokens, modes."""
    out = []
    frame = pd.DataFrame([{"method": r["method"], "dataset": r["dataset"], **totals(r["steps"]),
                           "emitted": sum(s["emitted"] for s in r["steps"]),
                           "runs": sum(s["sampled"] for s in r["steps"]) + int(bool(r["steps"])
                                                                              and not r["steps"][-1]["sampled"]),
                           "post_steps": sum(s["mode"] == "post" for s in r["steps"])} for r in rows])
    if frame.empty:
        return frame
    for (method, dataset), g in frame.groupby(["method", "dataset"], sort=False):
        out.append({"method": method, "dataset": dataset, "steps": int(g.steps.sum()),
                    "post_verify_share": round(g.post_steps.sum() / max(g.steps.sum(), 1), 3),
                    "draft_busy_s": round(g.draft_busy_s.sum(), 3), "target_busy_s": round(g.target_busy_s.sum(), 3),
                    "overlap_s": round(g.overlap_s.sum(), 3), "target_idle_s": round(g.target_idle_s.sum(), 3),
                    "draft_idle_s": round(g.draft_idle_s.sum(), 3), "mutual_wait_s": round(g.mutual_wait_s.sum(), 3),
                    "mean_accepted_tokens": round(g.emitted.sum() / max(g.runs.sum(), 1), 3)})
    return pd.DataFrame(out)


def gantt(steps: list[dict], path: Path, title: str, seconds: float | None = 1.5) -> None:
    """Gantt-style PNG: drafter and target busy spans over time, coloured by step mode (the first `seconds`)."""
    shown = [s for s in steps if seconds is None or s["t0"] < seconds]
    fig, ax = plt.subplots(figsize=(11, 2.4))
    for s in shown:
        color = COLORS.get(s["mode"], "#999999")
        for row, span in ((1, s["draft"]), (0, s["target"])):
            if span:
                ax.broken_barh([(span[0], span[1] - span[0])], (row - 0.35, 0.7), facecolors=color,
                               edgecolor="black", linewidth=0.3)
        ax.axvline(s["t1"], color="#dddddd", linewidth=0.5, zorder=0)
    ax.set_yticks([0, 1], ["target", "drafter"])
    ax.set_xlabel("seconds since the start of the generation")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[m]) for m in COLORS if any(s["mode"] == m for s in shown)]
    ax.legend(handles, [m for m in COLORS if any(s["mode"] == m for s in shown)], loc="upper right", fontsize=7,
              ncols=5)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report_section(run_dir: Path) -> list[str]:
    """Markdown lines for report.md (and timeline_summary.csv, one Gantt PNG per method); [] without timelines."""
    run_dir = Path(run_dir)
    rows = read(run_dir)
    if not rows:
        return []
    summary = summarize(rows)
    summary.to_csv(run_dir / "timeline_summary.csv", index=False)
    md = ["## Draft / target timeline", "", markdown_table(summary), "",
          "Seconds summed over all prompts. target idle = step time - target busy; drafter idle = step time - "
          "drafter busy; mutual waiting = their sum; overlap = time both were busy at once. mean accepted tokens = "
          "emitted tokens / target-sampled tokens (PEARL §4.4.2; equals tau for sd).", ""]
    for method in dict.fromkeys(r["method"] for r in rows):
        first = next(r for r in rows if r["method"] == method)
        name = f"timeline_{method}.png"
        gantt(first["steps"], run_dir / name, f"{method}: {first['dataset']} prompt {first['prompt_id']}")
        md.append(f"![{method} timeline]({name})")
    return md + [""]

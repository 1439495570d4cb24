"""Per-step timelines of the draft-model methods: when the drafter and the target were busy, and the mutual waiting
that PEARL sets out to remove (PEARL §3.1, Fig. 1 and 3; App. D.3 times each component of a step).

A step is one dict (made by methods/timeline.timeline_entry, stored in Generation.timeline, saved by the runner as
timeline.jsonl through run/results.append_timeline):
  mode       sd | pre | post | draft (pearl-no-pre's lone drafting) | verify (pearl-no-post's lone verification)
  t0, t1     step start and end, seconds since the generation started
  draft      [start, end] of the drafter's busy span, or null;  target: the same for the target
  checked    draft tokens the target checked; accepted: of those, kept; emitted: tokens the step appended
  sampled    1 when the step ended with a token sampled from the target (a correction or bonus token)

Definitions used in reports:
  target idle  = step time - target busy;  drafter idle = step time - drafter busy;  mutual waiting = their sum
  host         = step time - (drafter busy + target busy - overlap): the step's time neither span covers
                 (acceptance, cache updates, host syncs between the spans: the host overhead, per step)
  mean accepted tokens (PEARL §4.4.2) = emitted tokens / target-sampled tokens: the tokens of one drafting run,
  from one target-sampled token to the next, whatever the number of consecutive post-verify rounds it spans
  (for sd it equals tau).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from ..core.store import RunFolder  # noqa: E402
from .markdown import markdown_table  # noqa: E402

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
            "host_s": sum(host_gaps_s(s) for s in steps),
            "mean_accepted_tokens": emitted / runs if runs else float("nan")}


def host_gaps(step: dict) -> list[tuple[float, float]]:
    """The (start, length) stretches of a step that neither the drafter's nor the target's span covers: host work."""
    spans = sorted(tuple(sp) for sp in (step["draft"], step["target"]) if sp)
    gaps, at = [], step["t0"]
    for start, end in spans:
        if start > at:
            gaps.append((at, start - at))
        at = max(at, end)
    if step["t1"] > at:
        gaps.append((at, step["t1"] - at))
    return gaps


def host_gaps_s(step: dict) -> float:
    return sum(length for _, length in host_gaps(step))


def read(run_dir: Path) -> list[dict]:
    """The rows of timeline.jsonl (the last one wins for a key written twice by a resumed run)."""
    path = RunFolder(run_dir).timeline
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
                    "host_s": round(g.host_s.sum(), 3), "host_share": round(g.host_s.sum() / g.step_s.sum(), 3)
                    if g.step_s.sum() > 0 else float("nan"),
                    "draft_idle_s": round(g.draft_idle_s.sum(), 3), "mutual_wait_s": round(g.mutual_wait_s.sum(), 3),
                    "mean_accepted_tokens": round(g.emitted.sum() / max(g.runs.sum(), 1), 3)})
    return pd.DataFrame(out)


def gantt(steps: list[dict], path: Path, title: str, seconds: float | None = 1.5) -> None:
    """Gantt-style PNG: drafter and target busy spans over time, coloured by step mode (the first `seconds`; None or
    0: the whole generation). The title says which window is shown; the legend sits outside the axes."""
    if not seconds:
        seconds = None
    shown = [s for s in steps if seconds is None or s["t0"] < seconds]
    total = max((s["t1"] for s in steps), default=0.0)
    fig, ax = plt.subplots(figsize=(11, 3.0))
    for s in shown:
        color = COLORS.get(s["mode"], "#999999")
        for row, span in ((1, s["draft"]), (0, s["target"])):
            if span:
                ax.broken_barh([(span[0], span[1] - span[0])], (row - 0.35, 0.7), facecolors=color,
                               edgecolor="black", linewidth=0.3)
        gaps = host_gaps(s)  # the host's share of the step (neither span)
        if gaps:
            ax.broken_barh(gaps, (-1.35, 0.7), facecolors="#dd8452", edgecolor="none")
        ax.axvline(s["t1"], color="#dddddd", linewidth=0.5, zorder=0)
    ax.set_yticks([-1, 0, 1], ["host", "target", "drafter"])
    ax.set_xlabel("seconds since the start of the generation")
    modes = [m for m in COLORS if any(s["mode"] == m for s in shown)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[m]) for m in modes]
    ax.legend(handles, modes, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0, fontsize=7,
              frameon=False, title="step mode", title_fontsize=7)
    window = (f"first {seconds:g} s of {total:.2f} s shown" if seconds is not None and total > seconds
              else f"whole generation, {total:.2f} s")
    ax.set_title(f"{title}; {window}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]+", "-", str(text)).strip("-") or "x"


def png_name(method: str, row: dict | None = None) -> str:
    """timeline_<method>.png for the first prompt (row None); timeline_<method>_<dataset>-<prompt>.png for any."""
    if row is None:
        return f"timeline_{method}.png"
    return f"timeline_{_slug(method)}_{_slug(row['dataset'])}-{_slug(row['prompt_id'])}.png"


def draw(run_dir: Path, rows: list[dict] | None = None, prompts: int | None = 1, title: str = "",
         seconds: float | None = 1.5) -> list[Path]:
    """Gantt PNGs of the first turn of each method's first `prompts` prompts (None: all), in run order: the first
    prompt as timeline_<method>.png, and with prompts != 1 every drawn prompt (the first too) also as
    timeline_<method>_<dataset>-<prompt>.png. `title` (titles.plot_title) heads each chart. Returns the paths."""
    run_dir = Path(run_dir)
    rows = read(run_dir) if rows is None else rows
    paths = []
    for method in dict.fromkeys(r["method"] for r in rows):
        firsts = {}  # (dataset, prompt) -> its first turn's row, in run order
        for r in rows:
            key = (r["dataset"], str(r["prompt_id"]))
            if r["method"] == method and (key not in firsts or r["turn"] < firsts[key]["turn"]):
                firsts[key] = r
        chosen = list(firsts.values())[: prompts or None]
        head = f"{title}\n" if title else ""
        for k, r in enumerate(chosen):
            label = (f"{head}{method}: {r['dataset']} prompt {r['prompt_id']} ({'first' if k == 0 else f'#{k + 1}'} "
                     f"of {len(firsts)} prompts), turn {int(r['turn']) + 1}")
            names = ([png_name(method)] if k == 0 else []) + ([png_name(method, r)] if prompts != 1 else [])
            for name in names:
                gantt(r["steps"], run_dir / name, label, seconds)
                paths.append(run_dir / name)
    return paths


def report_section(run_dir: Path, title: str = "", prompts: int | None = 1) -> list[str]:
    """Markdown lines for report.md (and timeline_summary.csv, Gantt PNGs of each method's first `prompts` prompts:
    see draw); [] without timelines."""
    run_dir = Path(run_dir)
    rows = read(run_dir)
    if not rows:
        return []
    summary = summarize(rows)
    summary.to_csv(run_dir / "timeline_summary.csv", index=False)
    md = ["## Draft / target timeline", "", markdown_table(summary), "",
          "Seconds summed over all prompts. target idle = step time - target busy; drafter idle = step time - "
          "drafter busy; mutual waiting = their sum; overlap = time both were busy at once; host = step time "
          "neither span covers (host overhead: acceptance, cache updates, syncs), host_share = host / step time "
          "(the Gantt charts' bottom row). mean accepted tokens = "
          "emitted tokens / target-sampled tokens (PEARL §4.4.2; equals tau for sd).", ""]
    draw(run_dir, rows, prompts, title)
    md += [f"Gantt charts below: each method's **first prompt only** (its first turn, the first 1.5 s), as "
           f"`timeline_<method>.png`. To draw other prompts: `python -m specbench.report.timeline {run_dir} "
           "--prompts all` (or `--prompts N` for the first N; `--seconds 0` for whole generations), which writes "
           "`timeline_<method>_<dataset>-<prompt>.png` per prompt.", ""]
    for method in dict.fromkeys(r["method"] for r in rows):
        md.append(f"![{method} timeline]({png_name(method)})")
    return md + [""]


def _prompt_count(text: str):
    """--prompts: 'all' or a positive number (argparse names the option and the value when it is neither)."""
    if text == "all":
        return text
    if not text.isdigit() or int(text) < 1:
        raise ValueError(text)
    return int(text)


_prompt_count.__name__ = "'all' or positive number"  # what argparse calls the expected value


def main(argv: list[str] | None = None) -> None:
    """python -m specbench.report.timeline RUN_DIR [--prompts N|all] [--seconds S]: draw Gantt PNGs of more prompts."""
    import argparse

    from ..run.results import read_meta
    from .titles import plot_title

    ap = argparse.ArgumentParser(prog="python -m specbench.report.timeline",
                                 description="Draw the draft / target Gantt chart of each sd / pearl prompt of a run "
                                             "(timeline_<method>_<dataset>-<prompt>.png in the run folder).")
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--prompts", default="all", type=_prompt_count,
                    help="how many prompts per method, in run order, or 'all' (default)")
    ap.add_argument("--seconds", type=float, default=1.5, help="seconds of each generation shown; 0: all (1.5)")
    args = ap.parse_args(argv)
    rows = read(args.run_dir)
    if not rows:
        raise SystemExit(f"{args.run_dir}: no {RunFolder(args.run_dir).timeline.name} (only sd / pearl runs write one)")
    prompts = None if args.prompts == "all" else args.prompts
    records_csv = RunFolder(args.run_dir).records
    records = pd.read_csv(records_csv, dtype={"prompt_id": str}) if records_csv.exists() else None
    title = plot_title(read_meta(args.run_dir), records)
    paths = draw(args.run_dir, rows, prompts, title, args.seconds)
    print(f"wrote {len(paths)} PNGs in {args.run_dir}: " + ", ".join(p.name for p in paths[:6])
          + (" ..." if len(paths) > 6 else ""))


if __name__ == "__main__":
    main()

"""report.md's "By prompt length" section, context.csv and context.png: tau and speedup per prompt-length bucket.

Acceptance falls as context grows in the engines users deploy, so a single tau over a set of mixed lengths hides
how a method fares on long prompts. Each prompt turn is put in a bucket by its prompt length in tokens
(records.csv `prompt_tokens`: what the method was given after the chat template, and after truncation to the
context), taken from ar's record of the same turn so that a method and ar are always compared on the same
turns; within a bucket the numbers are summary.py's (speedup against ar on the same prompt turns). A bucket with
fewer than MIN_TURNS turns of a method gets no tau or speedup, only a note saying so: one or two turns say
little about a length.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..run import noise
from .compact import timing_word
from .markdown import markdown_table
from .plots import plt
from .summary import named, summarize
from .titles import set_title

MIN_TURNS = 3
# (low, high, label): low <= prompt tokens < high
BUCKETS = ((0, 256, "<256"), (256, 1024, "256-1k"), (1024, 2048, "1k-2k"), (2048, 4096, "2k-4k"),
           (4096, math.inf, ">=4k"))
COLUMNS = ["method", "dataset", "bucket", "prompts", "turns", "prompt_tokens", "tokens_per_s", "tau", "speedup",
           "speedup_lo", "speedup_hi", "acceptance_rate", "timing", "note"]
# blanked where a bucket has too few turns
SHOWN = ("tokens_per_s", "tau", "speedup", "speedup_lo", "speedup_hi", "acceptance_rate")


def bucket_of(tokens: float) -> str:
    """The label of the bucket holding a prompt of `tokens` tokens ("" when unknown)."""
    if tokens is None or not math.isfinite(tokens):
        return ""
    return next(label for low, high, label in BUCKETS if low <= tokens < high)


def turn_lengths(records: pd.DataFrame) -> pd.Series:
    """Each record's prompt length as ar's record of the same dataset x prompt x turn has it (the record's own
    when ar has no record of that turn), so that a method and ar put a turn in the same bucket."""
    tokens = pd.to_numeric(records.prompt_tokens, errors="coerce")
    key = list(zip(records.dataset, records.prompt_id.astype(str), records.turn))
    ar = records.method == "ar"
    ar_tokens = dict(zip((k for k, a in zip(key, ar) if a), tokens[ar]))
    return pd.Series([ar_tokens.get(k, t) for k, t in zip(key, tokens)], index=records.index, dtype=float)


def by_prompt_length(records: pd.DataFrame, latency_floor: float = 1.0) -> pd.DataFrame:
    """One row per method x dataset x bucket (COLUMNS; batch > 1 rows named "sd B=8 unpadded"), buckets in
    length order; empty when the records carry no prompt lengths."""
    if records.empty or "prompt_tokens" not in records:
        return pd.DataFrame(columns=COLUMNS)
    lengths = turn_lengths(records)
    bucket = lengths.map(bucket_of)
    records, lengths, bucket = records[bucket != ""], lengths[bucket != ""], bucket[bucket != ""]
    if records.empty:
        return pd.DataFrame(columns=COLUMNS)
    pairs = list(dict.fromkeys(zip(records.dataset, bucket)))
    key = {pair: f"#{i}" for i, pair in enumerate(pairs)}
    back = {k: pair for pair, k in key.items()}
    split = named(summarize(records.assign(dataset=[key[p] for p in zip(records.dataset, bucket)]),
                           latency_floor=latency_floor))
    mean_tokens = lengths.groupby([records.dataset, bucket]).mean()  # ar's lengths: the same for every method
    split["bucket"] = split.dataset.map(lambda k: back[k][1])
    split["dataset"] = split.dataset.map(lambda k: back[k][0])
    split["prompt_tokens"] = [round(mean_tokens[(d, b)]) for d, b in zip(split.dataset, split.bucket)]
    few = split.turns < MIN_TURNS
    split["note"] = [f"too few turns ({n} < {MIN_TURNS}): no tau or speedup" if f else ""
                     for n, f in zip(split.turns, few)]
    for column in SHOWN:
        split[column] = split[column].astype(float).where(~few, math.nan)
    order = {label: i for i, (_, _, label) in enumerate(BUCKETS)}
    methods = {m: i for i, m in enumerate(dict.fromkeys(split.method))}
    split = split.sort_values(["dataset", "method", "bucket"], kind="stable",
                              key=lambda c: c.map(order) if c.name == "bucket" else
                              c.map(methods) if c.name == "method" else c)
    return split[COLUMNS].reset_index(drop=True)


def cut_note(records: pd.DataFrame, shown: int = 10) -> list[str]:
    """report.md's note on prompts cut from the left to fit the context (records.csv `prompt_cut`: tokens dropped),
    naming the prompt turns (ar's rows: every method got the same cut); empty when none was cut."""
    if records.empty or "prompt_cut" not in records:
        return []
    cut = records[pd.to_numeric(records.prompt_cut, errors="coerce").fillna(0) > 0]
    cut = cut[cut.method == "ar"] if (cut.method == "ar").any() else cut
    turns = cut.drop_duplicates(["dataset", "prompt_id", "turn"])
    if turns.empty:
        return []
    named_turns = [f"{r.dataset} {r.prompt_id}" + (f" turn {int(r.turn) + 1}" if int(r.turn) else "") +
                   f" (-{int(r.prompt_cut)} tokens)" for r in turns.head(shown).itertuples(index=False)]
    more = f" and {len(turns) - shown} more" if len(turns) > shown else ""
    return [f"**Prompts cut to fit the context**: {len(turns)} prompt turn(s) lost tokens from their left so that "
            f"--max-new-tokens fits: {', '.join(named_turns)}{more}. Their numbers are for the cut prompt "
            "(records.csv `prompt_cut`: tokens dropped, per row).", ""]


def section(records: pd.DataFrame, run_dir: Path, title: str = "", latency_floor: float = 1.0) -> list[str]:
    """report.md's "By prompt length" section; writes context.csv (and context.png when some method other than ar
    has numbers in two or more buckets). Empty when the records carry no prompt lengths."""
    table = by_prompt_length(records, latency_floor)
    if table.empty:
        return []
    table.to_csv(Path(run_dir) / "context.csv", index=False)
    edges = ", ".join(label for _, _, label in BUCKETS)
    shown = table.assign(timing=table.timing.map(timing_word))
    md = ["## By prompt length", "", markdown_table(shown), "",
          (f"Prompt turns bucketed by prompt length in tokens ({edges}; `prompt_tokens`: the mean of ar's turns "
           f"in the bucket), each bucket's speedup against `ar` on the same turns with its 95% interval "
           f"(`speedup_lo` - `speedup_hi`) and the noise guard's verdict (reasons in `context.csv`). A bucket with "
           f"fewer than {MIN_TURNS} turns gets no numbers. `--dataset cnn-dm-long` gives prompts of 1k-4k tokens."),
          ""]
    if plot(table, Path(run_dir) / "context.png", title):
        md += ["![tau and speedup by prompt length](context.png)", ""]
    return md


def plot(table: pd.DataFrame, path: Path, title: str = "") -> bool:
    """context.png: tau and speedup per bucket, one line per method (x dataset when several), the speedup with its
    95% interval as error bars and a bucket whose timing is disturbed ringed in red; False (no file) when no method
    other than ar has numbers in two buckets."""
    shown = table[(table.method != "ar") & table.tau.notna()]
    lines = [(key, g) for key, g in shown.groupby(["method", "dataset"], sort=False) if len(g) >= 2]
    if not lines:
        return False
    labels = [label for _, _, label in BUCKETS if label in set(shown.bucket)]
    x = {label: i for i, label in enumerate(labels)}
    several = shown.dataset.nunique() > 1
    said = False  # the "timing disturbed" legend entry, once
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for (method, dataset), g in lines:
        name = f"{method} ({dataset})" if several else method
        xs = [x[b] for b in g.bucket]
        axes[0].plot(xs, g.tau, marker="o", label=name)
        low, high = g.speedup - g.speedup_lo, g.speedup_hi - g.speedup
        axes[1].errorbar(xs, g.speedup, yerr=[low.clip(lower=0).fillna(0), high.clip(lower=0).fillna(0)],
                         marker="o", capsize=3, label=name)
        bad = g.timing.map(noise.is_disturbed).to_numpy()
        if bad.any():  # the speedup only: tau counts forwards, which load does not change
            axes[1].scatter([v for v, b in zip(xs, bad) if b], g.speedup[bad], s=110, facecolors="none",
                            edgecolors="firebrick", linewidths=1.2, zorder=3,
                            label=None if said else "timing disturbed")
        said = said or bool(bad.any())
    for ax, ylabel in zip(axes, ("tau (tokens per target forward)", "speedup over ar")):
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    set_title(axes[0], title, 9)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True

"""The report's batching section (EMS-SD Tables 2-4, Fig. 4 and Fig. 6, for this machine): per dataset, method and
batch size, the throughput and speedup of the padded (vanilla) and unpadded (EMS-SD) modes against ar at the same
batch size, the tokens each fed through the target and the padding share, the lowest per-sample tau in a batch
beside the mean, and peak memory; a plot of speedup against batch size for both modes. Computed from summary.csv
rows only."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from . import batchbest, choicecheck, pareto  # noqa: E402
from ..run import noise  # noqa: E402
from .markdown import markdown_table  # noqa: E402
from .titles import set_title  # noqa: E402

COLUMNS = ["dataset", "method", "B", "ar tok/s", "padded tok/s", "padded speedup", "unpadded tok/s",
           "unpadded speedup", "unpadded / padded", "ar decode tok/s", "padded decode tok/s", "unpadded decode tok/s",
           "unpadded / padded decode", "target tokens padded", "target tokens unpadded", "fewer tokens",
           "padding ratio", "padding ratio (EMS-SD)", "kv padding", "tau", "tau batch min", "lossless explained padded",
           "lossless explained unpadded", "peak MB padded", "peak MB unpadded"]
# batching.csv only (the plot's error bars and marks; report.md's table leaves them out)
PLOT_COLUMNS = ["padded speedup lo", "padded speedup hi", "unpadded speedup lo", "unpadded speedup hi",
                "padded timing", "unpadded timing"]


def has_batches(summary: pd.DataFrame) -> bool:
    return "batch_size" in summary and (pd.to_numeric(summary.batch_size, errors="coerce").fillna(1) > 1).any()


def table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per dataset x method x batch size (batch 1 included, both modes then being the one-at-a-time row)."""
    rows = []
    s = summary.assign(batch_size=pd.to_numeric(summary.batch_size, errors="coerce").fillna(1).astype(int))
    for (dataset, size), part in s.groupby(["dataset", "batch_size"], sort=True):
        ar = part[part.method == "ar"]
        ar_tps = float(ar.tokens_per_s.iloc[0]) if len(ar) else math.nan
        ar_decode = float(ar.decode_tokens_per_s.iloc[0]) if len(ar) and "decode_tokens_per_s" in ar else math.nan
        for method in [m for m in dict.fromkeys(part.method) if m != "ar"]:
            mine = part[part.method == method]
            by_mode = {m: r for m, r in zip(mine.batching, mine.itertuples(index=False))}
            pad = by_mode.get("padded") or by_mode.get("-")  # batch 1: the one row stands for both modes
            unpad = by_mode.get("unpadded") or by_mode.get("-")
            main = unpad or pad

            def get(r, column):  # NaN for a missing mode, or a column older summaries lack
                return getattr(r, column, math.nan) if r is not None else math.nan

            rows.append({
                "dataset": dataset, "method": method, "B": size, "ar tok/s": ar_tps,
                "padded tok/s": get(pad, "tokens_per_s"), "padded speedup": get(pad, "speedup"),
                "unpadded tok/s": get(unpad, "tokens_per_s"), "unpadded speedup": get(unpad, "speedup"),
                "unpadded / padded": get(unpad, "tokens_per_s") / get(pad, "tokens_per_s"),
                "ar decode tok/s": ar_decode, "padded decode tok/s": get(pad, "decode_tokens_per_s"),
                "unpadded decode tok/s": get(unpad, "decode_tokens_per_s"),
                "unpadded / padded decode": get(unpad, "decode_tokens_per_s") / get(pad, "decode_tokens_per_s"),
                "target tokens padded": get(pad, "target_tokens"),
                "target tokens unpadded": get(unpad, "target_tokens"),
                "fewer tokens": 1 - get(unpad, "target_tokens") / get(pad, "target_tokens"),
                "padding ratio": get(pad, "padding_ratio"), "padding ratio (EMS-SD)": get(pad, "kv_padding_ratio"),
                "kv padding": get(pad, "kv_padding"), "tau": get(main, "tau"),
                "tau batch min": get(main, "tau_batch_min"),
                "lossless explained padded": get(pad, "lossless_explained_rate"),
                "lossless explained unpadded": get(unpad, "lossless_explained_rate"),
                "peak MB padded": get(pad, "peak_mem_mb"), "peak MB unpadded": get(unpad, "peak_mem_mb"),
                **{f"{mode} speedup {end}": get(r, f"speedup_{end}") for mode, r in (("padded", pad),
                                                                                      ("unpadded", unpad))
                   for end in ("lo", "hi")},
                **{f"{mode} timing": "" if r is None else str(getattr(r, "timing", ""))
                   for mode, r in (("padded", pad), ("unpadded", unpad))}})
    return pd.DataFrame(rows, columns=COLUMNS + PLOT_COLUMNS)


def _shown(frame: pd.DataFrame) -> pd.DataFrame:
    """Display strings: speedups as 1.23x, shares as percent."""
    out = frame.copy()
    for col in out.columns:
        if col.endswith("speedup") or col.startswith("unpadded / padded"):
            out[col] = out[col].map(lambda v: f"{v:.2f}x" if isinstance(v, float) and math.isfinite(v) else "-")
        elif col in ("fewer tokens", "padding ratio", "padding ratio (EMS-SD)") or col.startswith("lossless"):
            out[col] = out[col].map(lambda v: f"{v:.0%}" if isinstance(v, float) and math.isfinite(v) else "-")
        elif col.endswith("tok/s") or col.startswith("tau"):
            out[col] = out[col].map(lambda v: f"{v:.2f}" if isinstance(v, float) and math.isfinite(v) else "-")
        elif col.startswith(("target", "kv", "peak")):
            out[col] = out[col].map(lambda v: f"{v:.0f}" if isinstance(v, (int, float)) and math.isfinite(v) else "-")
    return out


def plot(frame: pd.DataFrame, path: Path, title: str = "") -> None:
    """Speedup over ar at the same batch size against the batch size: one panel per dataset, a line per method x
    mode (EMS-SD's Tables 2-4 as a picture), each point with its 95% interval as an error bar and ringed in red
    when the noise guard distrusts its timing."""
    datasets = list(dict.fromkeys(frame.dataset))
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.2 * len(datasets), 3.6), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        part = frame[frame.dataset == dataset]
        said = False  # the "timing disturbed" legend entry, once a panel
        for i, method in enumerate(dict.fromkeys(part.method)):
            rows = part[part.method == method].sort_values("B")
            for mode, style in (("unpadded", "-o"), ("padded", "--s")):  # one colour per method, a style per mode
                y = pd.to_numeric(rows[f"{mode} speedup"], errors="coerce")
                low = (y - pd.to_numeric(rows.get(f"{mode} speedup lo"), errors="coerce")).clip(lower=0).fillna(0)
                high = (pd.to_numeric(rows.get(f"{mode} speedup hi"), errors="coerce") - y).clip(lower=0).fillna(0)
                ax.errorbar(rows.B, y, yerr=[low, high], fmt=style, color=f"C{i}", capsize=3, markersize=5,
                            label=f"{method} {mode}")
                bad = rows.get(f"{mode} timing", pd.Series("", index=rows.index)).map(noise.is_disturbed)
                if bad.any():
                    ax.scatter(rows.B[bad], y[bad], s=110, facecolors="none", edgecolors="firebrick",
                               linewidths=1.2, zorder=3, label=None if said else "timing disturbed")
                    said = True
        ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(part.B.unique()), [str(b) for b in sorted(part.B.unique())])
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup over ar at the same batch size")
        ax.set_title(dataset, fontsize=9)
        ax.legend(fontsize=7, frameon=False)
    set_title(axes[0][0], title, 5.2 * len(datasets))
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def section(summary: pd.DataFrame, run_dir: Path, title: str = "", chosen: dict | None = None,
            trees: dict | None = None) -> list[str]:
    """report.md's batching section, batching.csv and batch_speedup.png, then the sweep's throughput-latency plot
    (pareto.csv, pareto.png), the fastest label per batch size (batch_fastest.csv) and, for a tree-size sweep with
    `auto`, the tool's choice against it (choice_check.csv). `chosen`, `trees`: run.yaml's (what each method
    chose, per batch size); [] for a run without batch > 1."""
    if not has_batches(summary):
        return []
    frame = table(summary)
    frame.to_csv(run_dir / "batching.csv", index=False)
    if not frame.empty:  # a batched run of ar alone has no speedup to draw, only its throughput (the sweep below)
        plot(frame, run_dir / "batch_speedup.png", title)
    return _batching_text(frame) + sweep_section(summary, run_dir, title, chosen, trees)


def sweep_section(summary: pd.DataFrame, run_dir: Path, title: str, chosen: dict | None,
                  trees: dict | None = None) -> list[str]:
    """Throughput against latency over the batch sizes (pareto.py), the fastest label per batch size
    (batchbest.py) and the tool's choice against a size sweep (choicecheck.py)."""
    points = pareto.points(summary)
    points.to_csv(run_dir / "pareto.csv", index=False)
    pareto.plot(points, run_dir / "pareto.png", title)
    best = batchbest.fastest(points, summary, chosen)
    best.to_csv(run_dir / "batch_fastest.csv", index=False)
    fallback = (points.per_sample_from != "measured").any()
    front = points[points.pareto].drop_duplicates(["dataset", "method", "B"])
    on_front = "; ".join(f"{d}: " + ", ".join(f"{r.method} B={r.B}" + ("" if r.B == 1 else f" {r['mode']}")
                                              for _, r in part.sort_values("tokens_per_s").iterrows())
                         for d, part in front.groupby("dataset", sort=False))
    return ["### Throughput against latency", "",
            "Each line is a method in one batching mode through its batch sizes (points labelled B=...): x = "
            "**throughput**, total tokens/s of all samples (the summary's `tokens_per_s`); y = **tokens/s per "
            "sample**, what one request sees: each sample's new tokens over its own time in its batch (from joining "
            "the batch to its last token, prefill and waiting for the batch's other rows included), pooled over the "
            "samples (`sample_tokens_per_s`; at B = 1 it equals the throughput). A larger batch moves a line right "
            "(more tokens in all) and down (each request slower). The Pareto front (ringed) holds the points no "
            "other point beats on both: for a latency target, the best throughput that meets it. Horizontal bars "
            "carry each speedup's 95% interval to the throughput axis (ar's throughput at that B times the "
            "interval's ends); a red cross marks a point whose timing the noise guard distrusts."
            + (" Rows from records without `latency_s` use throughput / B instead (`per_sample_from` in "
               "pareto.csv)." if fallback else ""), "",
            f"On the front: {on_front}.", "",
            "![throughput against latency](pareto.png)", "", "Points: [pareto.csv](pareto.csv).", "",
            "### Fastest at each batch size", "",
            "The label with the most total tokens/s at each batch size, its speedup over `ar` at the same B, the "
            "runner-up, and what the method chose for that batch size itself (`--tree auto` / `--gamma auto` "
            "per batch size from this hardware's L(B, w), `specbench profile --batch-size`; `batch 1` when the "
            "profile had no such B). `timing` is the noise guard's verdict on that row.", "",
            markdown_table(batchbest.shown(best)), "", "[batch_fastest.csv](batch_fastest.csv)", ""] + \
        _choice_lines(points, run_dir, chosen, trees)


def _choice_lines(points: pd.DataFrame, run_dir: Path, chosen: dict | None, trees: dict | None) -> list[str]:
    frame, lines = choicecheck.section(points, chosen, trees)
    if lines:
        frame.to_csv(run_dir / "choice_check.csv", index=False)
    return lines


def _batching_text(frame: pd.DataFrame) -> list[str]:
    return ["## Batching (EMS-SD)", "",
            "Prompts decoded B at a time. `padded` is the vanilla way (inputs padded to the widest sample, KV caches "
            "to the longest accepted length); `unpadded` is EMS-SD (each sample keeps its own KV length, all "
            "samples' new tokens packed into one forward, no padding token in a linear layer). Speedups are "
            "throughput ratios against `ar` decoding the same prompts at the same batch size (unpadded: no prompt "
            "padding either). `target tokens`: tokens fed through the target, prefill and padding included; "
            "`padding ratio`: the padded mode's padding share of them (ours, at most 100%); `kv padding`: padded KV "
            "entries the samples held when they left (EMS-SD Appendix B's padding, `specbench estimate --padding "
            "--run` models it); `padding ratio (EMS-SD)`: the paper's ratio, kv padding per accepted (new) token, "
            "which passes 100% when padding outnumbers the tokens kept; `decode tok/s`: EMS-SD §4.1's incremental "
            "decoding, the batch's prefill-only steps timed apart (end-to-end `tok/s` includes them; with `--refill` "
            "a prompt that joins mid-batch prefills inside a decoding step, counted as decoding in both modes); "
            "`lossless explained`: exact or near-tie against batch-1 `ar` (the batch-1 rule, `lossless_explained_rate`); "
            "`tau batch min`: the lowest per-sample tau in a batch, averaged over batches (EMS-SD §4.4: the batch "
            "waits for its slowest sample unless `--refill`).", "",
            markdown_table(_shown(frame[COLUMNS])), "", "![speedup against batch size](batch_speedup.png)", "",
            "In the plot, error bars are each speedup's 95% bootstrap interval; a red ring marks a point whose timing "
            "the noise guard distrusts (batching.csv has both, `... speedup lo / hi` and `... timing`).", ""]

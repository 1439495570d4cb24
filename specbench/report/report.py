"""Summaries, Markdown and plots, computed from result CSVs only (reports never re-run models).

Speedup formulas (both from the same run, same prompts, same machine):
  speedup       = (sum new_tokens / sum wall_s)_method / (sum new_tokens / sum wall_s)_ar   (headline)
  speedup_mean  = mean over prompt turns of tokens_per_s_method / tokens_per_s_ar
  tau           = sum new_tokens / sum target_forwards   (bonus token included; ar = 1.00)
  acceptance    = sum accepted_drafts / sum drafted
  draft_ms_per_token   = 1000 * sum draft_s / sum new_tokens   (drafting ms per emitted token; draft-model methods)
  draft_forwards_per_step = sum draft_forwards / sum target_forwards   (drafter forwards per target forward)
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from ..errors import SpecbenchError  # noqa: E402
from . import batchreport, csvcheck
from ..run import noise
from . import timeline
from .markdown import markdown_table  # noqa: E402
from ..run.results import read_meta, with_batch_columns  # noqa: E402
from .titles import comparison_title, plot_title, set_title  # noqa: E402, F401 (plot_title: API)

FORMULAS = __doc__.split("Speedup formulas", 1)[1].strip()
SUMMARY_COLUMNS = ["method", "dataset", "prompts", "turns", "new_tokens", "wall_s", "tokens_per_s", "speedup",
                   "speedup_mean", "tau", "draft_ms_per_token", "acceptance_rate", "drafted", "draft_forwards",
                   "draft_s", "draft_forwards_per_step", "lossless_rate", "lossless_explained_rate", "exactness",
                   "peak_mem_mb", "extra_mem_mb", "forward_ms", "forward_ratio", "speedup_bound", "disturbed_rows",
                   "timing", "batch_size", "batching", "target_tokens", "padding_tokens", "padding_ratio", "kv_padding",
                   "tau_batch_min", "tau_sample_mean"]


def read_records(run_dir: Path) -> pd.DataFrame:
    path = Path(run_dir) / "records.csv"
    if not path.exists():
        raise SpecbenchError(f"{run_dir}: no records.csv here; pass a folder written by `specbench run`.")
    try:
        df = pd.read_csv(path, dtype={"prompt_id": str, "lossless": str}, keep_default_na=False,
                         na_values={"acceptance_rate": [""], "tokens_per_s": [""]})
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise SpecbenchError(f"{path}: not a readable records CSV ({exc})") from exc
    missing = {"method", "dataset", "prompt_id", "turn", "new_tokens", "wall_s", "target_forwards"} - set(df)
    if missing:
        raise SpecbenchError(f"{path}: missing columns {', '.join(sorted(missing))}")
    return csvcheck.numeric(df, path, RECORD_NUMBERS)  # a hand-edited or torn row is named, not a traceback


# records.csv columns the summary does arithmetic on
RECORD_NUMBERS = ("turn", "new_tokens", "wall_s", "tokens_per_s", "target_forwards", "drafted", "draft_forwards",
                  "draft_s", "accepted_drafts", "peak_mem_mb", "forward_ms", "foreign_cpu", "steal")


def _exactness(method: str) -> str:
    from ..methods import REGISTRY

    cls = REGISTRY.get(method.split("@")[0])  # sweep labels: <method>@<tree size>
    return "" if cls is None else ("lossless" if cls.lossless else "lossy")


# ------------------------------------------------------------------------------------------------ lossless check
LOSSLESS_TEXT = (
    "Lossless check (temperature 0, every method's tokens against `ar`'s on the same prompt turn). "
    "`lossless_rate` = exact: the share of checked turns whose tokens equal `ar`'s, token for token; it guarantees "
    "identical text on those turns. `lossless_explained_rate` = exact or explained: also counts turns whose first "
    "differing token is a near-tie, i.e. `ar`'s logit margin between its own token and the method's "
    "(`mismatch_logit_gap` in records.csv) is within what the dtype's rounding can flip between a batched and a "
    "one-token forward (`specbench/run/lossless.py`: about 1.7 logits for SmolLM2 in bf16, 4e-4 in float32). It "
    "guarantees that no turn diverged where rounding cannot explain it: the method chose, at the first difference, a "
    "token `ar`'s own arithmetic could have chosen; the text after that point differs legitimately and is not "
    "compared. In float32 both rates should be 1.0; in bf16/fp16 the exact rate can be low while the explained rate "
    "stays 1.0. An unexplained mismatch of a lossless method is a defect to investigate.")


def lossless_verdicts(records: pd.DataFrame) -> pd.Series:
    """Per record: "" (not checked: T > 0 or ar), "match", "near-tie", "unexplained", or "no verdict" (a mismatch in
    a run older than the near-tie check, which counts as unexplained)."""
    lossless = records["lossless"].astype(str) if "lossless" in records else pd.Series("", index=records.index)
    explained = (records["mismatch_explained"].astype(str) if "mismatch_explained" in records
                 else pd.Series("", index=records.index))
    mismatch = lossless.str.startswith("mismatch")
    out = pd.Series("", index=records.index, dtype=object)
    out[lossless == "match"] = "match"
    out[mismatch] = "unexplained"
    out[mismatch & (explained == "near-tie")] = "near-tie"
    out[mismatch & explained.isin(["", "nan"])] = "no verdict"
    return out


def _explained_rate(g: pd.DataFrame) -> float:
    """(exact matches + near-tie mismatches) / checked turns."""
    v = lossless_verdicts(g)
    v = v[v != ""]
    return round(v.isin(["match", "near-tie"]).mean(), 3) if len(v) else math.nan


def unexplained_mismatches(records: pd.DataFrame) -> pd.DataFrame:
    """Turns of lossless methods that differ from ar where rounding does not explain it (the check has FAILED):
    method, dataset, prompt_id, turn, index (first differing token), gap (ar's logit margin, NaN when unknown) and
    verdict ("unexplained", or "no verdict" for runs older than the near-tie check)."""
    columns = ["method", "dataset", "prompt_id", "turn", "index", "gap", "verdict"]
    if records.empty or "lossless" not in records:
        return pd.DataFrame(columns=columns)
    verdicts = lossless_verdicts(records)
    batched = with_batch_columns(records).batch_size > 1  # batched ar is checked against batch-1 ar too
    lossless = records.method.map(lambda m: _exactness(str(m)) != "lossy") & ((records.method != "ar") | batched)
    bad = records[verdicts.isin(["unexplained", "no verdict"]) & lossless]
    gap = (pd.to_numeric(bad["mismatch_logit_gap"], errors="coerce") if "mismatch_logit_gap" in bad
           else pd.Series(math.nan, index=bad.index))
    return pd.DataFrame({"method": bad.method, "dataset": bad.dataset, "prompt_id": bad.prompt_id.astype(str),
                         "turn": bad.turn, "index": bad["lossless"].astype(str).str.split("@").str[-1].astype(int),
                         "gap": gap.round(6), "verdict": verdicts[bad.index]}, columns=columns).reset_index(drop=True)


def lossless_failed_section(records: pd.DataFrame) -> list[str]:
    """The report's loud "Lossless check FAILED" section; [] when every lossless method's mismatch is explained."""
    bad = unexplained_mismatches(records)
    if bad.empty:
        return []
    old = (bad.verdict == "no verdict").any()
    return ["## Lossless check FAILED", "",
            f"**{len(bad)} prompt turn(s) of lossless methods differ from `ar` where the dtype's rounding does not "
            "explain it** (gap = `ar`'s logit of its own token minus its logit of the method's token at the first "
            "differing index; a near-tie would be within the rounding tolerance). Investigate these before trusting "
            "the method's output or its speedup." + (" Rows marked `no verdict` come from a run older than the "
                                                      "near-tie check (no gap recorded): re-run to classify them."
                                                      if old else ""), "",
            markdown_table(bad), ""]


def summarize(records: pd.DataFrame, temperature_greedy: bool = True, latency_floor: float = 1.0) -> pd.DataFrame:
    """One row per method x dataset x batch size x batching (SUMMARY_COLUMNS). Each method is compared with ar at
    the same batch size on the prompt turns both finished (an interrupted run may hold more of one than of the
    other); the noise guard's verdict per row. At batch > 1 the speedup is a throughput ratio (a sample's wall_s is
    its share of its batch's time), and the plausibility bound is not applied (profiles are measured at batch 1)."""
    records = with_batch_columns(records)
    parts = []
    for size, part in records.groupby("batch_size", sort=True):
        if size == 1:
            parts.append(_summarize(part, latency_floor).assign(batch_size=1, batching="-"))
            continue
        # one label per method x mode; ar (one mode per batch size) stays "ar", every method's reference
        labels = [m if m == "ar" else f"{m}|{b}" for m, b in zip(part.method, part.batching)]
        summary = _summarize(part.assign(method=labels), None)
        ar_mode = part.batching[part.method == "ar"].iloc[0] if (part.method == "ar").any() else "-"
        split = summary.method.str.split("|")
        parts.append(summary.assign(method=split.str[0], batch_size=int(size),
                                    batching=split.map(lambda x: x[1] if len(x) > 1 else ar_mode)))
    return pd.concat(parts, ignore_index=True)[SUMMARY_COLUMNS]


def _summarize(records: pd.DataFrame, latency_floor: float | None) -> pd.DataFrame:
    """summarize() for one batch size; latency_floor None: no plausibility bound."""
    rows = []
    ar = records[records.method == "ar"].set_index(["dataset", "prompt_id", "turn"])
    turn_key = ["dataset", "prompt_id", "turn"]
    for (method, dataset), g in records.groupby(["method", "dataset"], sort=False):
        ar_d = records[(records.method == "ar") & (records.dataset == dataset)]
        if method != "ar" and len(ar_d):
            shared = g[turn_key].merge(ar_d[turn_key]).drop_duplicates()
            g = g.merge(shared, on=turn_key)
            ar_d = ar_d.merge(shared, on=turn_key)
        ar_tps = ar_d.new_tokens.sum() / ar_d.wall_s.sum() if len(ar_d) and ar_d.wall_s.sum() > 0 else math.nan
        tps = g.new_tokens.sum() / g.wall_s.sum() if g.wall_s.sum() > 0 else math.nan
        joined = g.merge(ar[["tokens_per_s"]].reset_index(), on=["dataset", "prompt_id", "turn"],
                         suffixes=("", "_ar"))
        ratios = joined.tokens_per_s / joined.tokens_per_s_ar
        checked = g.lossless[g.lossless.astype(str) != ""]
        drafted = g.drafted.sum() if "drafted" in g else 0
        peak = g.peak_mem_mb.max() if "peak_mem_mb" in g else math.nan
        ar_peak = ar_d.peak_mem_mb.max() if "peak_mem_mb" in ar_d and len(ar_d) else math.nan
        fwd = g.wall_s.sum() / max(g.target_forwards.sum(), 1)  # seconds per target forward
        ar_fwd = ar_d.wall_s.sum() / max(ar_d.target_forwards.sum(), 1) if len(ar_d) else math.nan
        rows.append({
            "method": method, "dataset": dataset, "prompts": g.prompt_id.nunique(), "turns": len(g),
            "new_tokens": int(g.new_tokens.sum()), "wall_s": round(g.wall_s.sum(), 3),
            "tokens_per_s": round(tps, 2), "speedup": tps / ar_tps,
            "speedup_mean": round(ratios.mean(), 3) if ratios.notna().any() else math.nan,
            "tau": g.new_tokens.sum() / max(g.target_forwards.sum(), 1),
            "acceptance_rate": round(g.accepted_drafts.sum() / drafted, 3) if drafted else math.nan,
            "lossless_rate": round((checked == "match").mean(), 3) if len(checked) else math.nan,
            "lossless_explained_rate": _explained_rate(g),
            "exactness": _exactness(method), "peak_mem_mb": peak,
            "extra_mem_mb": round(peak - ar_peak, 1) if not math.isnan(peak) and not math.isnan(ar_peak) else math.nan,
            "forward_ms": round(fwd * 1e3, 3), "forward_ratio": round(fwd / ar_fwd, 3) if ar_fwd > 0 else math.nan,
            **_draft_numbers(g), **_batch_numbers(g),
        })
    summary = pd.DataFrame(rows, columns=[c for c in SUMMARY_COLUMNS if c not in NOISE_COLUMNS + ("batch_size",
                                                                                                 "batching")])
    return noise.judge(summary, records, latency_floor).round({"speedup": 3, "tau": 3})  # judged unrounded


NOISE_COLUMNS = ("speedup_bound", "disturbed_rows", "timing")  # added by noise.judge
DRAFT_COLUMNS = ("drafted", "draft_forwards", "draft_s", "draft_ms_per_token", "draft_forwards_per_step")


def _draft_numbers(g: pd.DataFrame) -> dict:
    """Drafting cost of one summary row: sums of drafted tokens, drafter forwards and seconds inside drafting, then
    drafting ms per emitted token and drafter forwards per target forward. The two ratios are NaN for methods with no
    drafter forward (ar, pld, ppd, ...); all but `drafted` are NaN for records older than these columns, and a mix
    of old and new rows sums only the rows that carry them."""
    out = dict.fromkeys(DRAFT_COLUMNS, math.nan)
    if "drafted" in g:
        out["drafted"] = int(pd.to_numeric(g.drafted, errors="coerce").sum())
    if "draft_forwards" not in g or "draft_s" not in g:
        return out
    forwards, seconds = (pd.to_numeric(g[c], errors="coerce") for c in ("draft_forwards", "draft_s"))
    known = g[forwards.notna() & seconds.notna()]
    if known.empty:
        return out
    n_forwards, n_seconds = forwards[known.index].sum(), seconds[known.index].sum()
    out.update(draft_forwards=int(n_forwards), draft_s=round(float(n_seconds), 4))
    if n_forwards > 0:
        out["draft_ms_per_token"] = round(1e3 * n_seconds / max(known.new_tokens.sum(), 1), 3)
        out["draft_forwards_per_step"] = round(n_forwards / max(known.target_forwards.sum(), 1), 3)
    return out


def _batch_numbers(g: pd.DataFrame) -> dict:
    """Padding and per-sample tau of one summary row (EMS-SD §4.3 Fig. 4, §4.4 Fig. 6): target tokens, the padding
    share of them, padded KV entries, and per batch the lowest per-sample tau (mean over batches) beside the mean
    per-sample tau. NaN for runs from before batching."""
    if "target_tokens" not in g:
        return dict.fromkeys(("target_tokens", "padding_tokens", "padding_ratio", "kv_padding", "tau_batch_min",
                              "tau_sample_mean"), math.nan)
    target = pd.to_numeric(g.target_tokens, errors="coerce").sum()
    padding = pd.to_numeric(g.get("padding_tokens", 0), errors="coerce").sum()
    tau = g.new_tokens / g.target_forwards.clip(lower=1)
    batch = g["batch_id"].astype(str) if "batch_id" in g else g.prompt_id.astype(str)
    batch = batch.where(~batch.isin(["", "nan"]), g.prompt_id.astype(str) + "/" + g.turn.astype(str))
    return {"target_tokens": int(target), "padding_tokens": int(padding),
            "padding_ratio": round(padding / target, 4) if target else math.nan,
            "kv_padding": int(pd.to_numeric(g.get("kv_padding", 0), errors="coerce").sum()),
            "tau_batch_min": round(tau.groupby(batch.values).min().mean(), 3), "tau_sample_mean": round(tau.mean(), 3)}


def row_name(r) -> str:
    """A summary row's name: the method, with its batch size and batching mode at batch > 1 ("sd B=8 unpadded")."""
    try:
        size = int(float(getattr(r, "batch_size", 1)))
    except (TypeError, ValueError):  # a hand-made or older summary: one prompt at a time
        size = 1
    if size <= 1:
        return str(r.method)
    return f"{r.method} B={size} {r.batching}"


def named(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary with each batched row's method named by row_name ("sd B=8 unpadded"), so that tools keyed on
    method x dataset (CI baselines, regressions, gates) see one row per key. Idempotent."""
    if "batch_size" not in summary:
        return summary
    names = [m if " B=" in str(m) else row_name(r) for m, r in zip(summary.method, summary.itertuples(index=False))]
    return summary.assign(method=names)


def disturbed(summary: pd.DataFrame) -> pd.DataFrame:
    """Rows whose timing the noise guard does not trust."""
    if "timing" not in summary:
        return summary.iloc[0:0]
    return summary[summary.timing.map(noise.is_disturbed)]


def noise_section(summary: pd.DataFrame, meta: dict) -> list[str]:
    """The report's account of how far the timings can be trusted (noise.py)."""
    guard = meta.get("noise_guard") or {}
    md = ["## Timing check (noise guard)", "",
          f"Each row records the CPU time other processes used while it was timed (`foreign_cpu`, cores), the "
          f"hypervisor's steal and the load average; a method x dataset is disturbed when over "
          f"{noise.DISTURBED_SHARE:.0%} of its or ar's rows ran beside more than {noise.FOREIGN_CPU_LIMIT} cores of "
          f"other work (or {noise.STEAL_LIMIT:.0%} steal), or when its speedup exceeds tau / floor x "
          f"{1 + noise.BOUND_TOLERANCE:.2f}, floor = min L(n) / L(1) = {guard.get('latency_floor', 1.0)} "
          f"({'profile ' + guard['profile'] if guard.get('profile') else 'no profile of this hardware: 1.0'}). "
          "Methods run in an order rotated per prompt, so a burst of load does not land on one method only.", ""]
    bad = disturbed(summary)
    if len(bad):
        md += ["**TIMING DISTURBED**: these numbers are not trustworthy; " + noise.ADVICE + ".", ""]
        md += [f"- {row_name(r)} on {r.dataset}: {r.timing}" for r in bad.itertuples(index=False)] + [""]
    else:
        md += ["All rows: timing ok.", ""]
    return md


def plot_bars(summary: pd.DataFrame, column: str, ylabel: str, path: Path, baseline: float | None = None,
              title: str = "") -> None:
    """Grouped bars: one group per dataset, one bar per method (plus a label column for compared runs); the value
    of each bar above it, the legend outside the axes on the right so that it covers no bar or label."""
    label = "label" if "label" in summary else "method"
    pivot = summary.pivot_table(index="dataset", columns=label, values=column, aggfunc="first", sort=False)
    width = max(5, 1.4 * len(pivot) * max(1, len(pivot.columns)) / 2)
    fig, ax = plt.subplots(figsize=(width, 3.6))
    pivot.plot.bar(ax=ax, rot=0, width=0.8)
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle="--", linewidth=1)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    for container in ax.containers:
        ax.bar_label(container, labels=[f"{v:.2f}" if math.isfinite(v) else "" for v in container.datavalues],
                     fontsize=7, padding=2)
    top = pd.to_numeric(pivot.stack(), errors="coerce").max() if pivot.size else math.nan
    if math.isfinite(top) and top > 0:
        ax.set_ylim(top=max(ax.get_ylim()[1], top * 1.12))  # headroom for the value labels
    set_title(ax, title, width)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # "tight" keeps the outside legend in the image
    plt.close(fig)


def write_plots(summary: pd.DataFrame, out: Path, title: str = "") -> list[Path]:
    """speedup.png, tokens_per_s.png and tau.png in `out`, each titled `title` (plot_title / comparison_title)."""
    paths = [out / "speedup.png", out / "tokens_per_s.png", out / "tau.png"]
    plot_bars(summary, "speedup", "speedup over ar (total tokens / total time)", paths[0], baseline=1.0, title=title)
    plot_bars(summary, "tokens_per_s", "tokens / s", paths[1], title=title)
    plot_bars(summary, "tau", "tau (tokens per target forward)", paths[2], baseline=1.0, title=title)
    return paths


def write_run_report(run_dir: Path) -> pd.DataFrame:
    """summary.csv, report.md and plots for one run folder; returns the summary."""
    run_dir = Path(run_dir)
    records = read_records(run_dir)
    if records.empty:
        raise SpecbenchError(f"{run_dir}: the run has no results yet (every prompt was skipped or none finished).")
    meta = read_meta(run_dir)
    summary = summarize(records, latency_floor=(meta.get("noise_guard") or {}).get("latency_floor", 1.0))
    summary.to_csv(run_dir / "summary.csv", index=False)
    title = plot_title(meta, records)
    # one prompt at a time: bars, categories, trees; batch > 1 has its own section (batchreport.py)
    single = summary[summary.batch_size == 1] if (summary.batch_size == 1).any() else summary
    single_records = with_batch_columns(records)
    single_records = single_records[single_records.batch_size == 1] if len(single) < len(summary) else records
    write_plots(single, run_dir, title=title)
    md = [f"# specbench run: {run_dir.name}", ""]
    if is_partial(meta):
        md += ["**PARTIAL**: the run was interrupted; each method is compared with ar on the prompt turns both "
               "finished. Continue it with `specbench run ... --resume`.", ""]
    md += lossless_failed_section(records)  # loud, at the top: lossless methods that differ from ar unexplained
    if meta.get("environment"):
        md += ["## Environment", ""] + [f"- {k}: {v}" for k, v in meta["environment"].items()]
        md += [f"- peak memory (`peak_mem_mb`): {meta['peak_memory']}"] if meta.get("peak_memory") else []
        md += [""]
    if meta.get("model"):
        md += [f"- model: {meta['model'].get('name')} ({meta['model'].get('source')})", ""]
    if meta.get("settings"):
        s = meta["settings"]
        md += ["## Settings", ""] + [f"- {k}: {v}" for k, v in s.items() if k != "options"]
        md += [f"- options: {s.get('options')}", ""]
    md += ["## Summary", "", markdown_table(named(summary)), ""]
    md += ["Lossy methods (typical acceptance) are labelled `lossy`. " + LOSSLESS_TEXT, ""]
    md += category_section(single_records, single, run_dir,
                           (meta.get("noise_guard") or {}).get("latency_floor", 1.0))
    md += batchreport.section(summary, run_dir, title)
    md += noise_section(summary, meta)
    md += ["## Formulas", "", "```", FORMULAS, "```", ""]
    md += ["![speedup](speedup.png)", "![tokens per second](tokens_per_s.png)", "![tau](tau.png)", ""]
    md += tree_section(single, meta.get("trees") or {}, run_dir, title=title)
    md += timeline.report_section(run_dir, title=title)  # sd / pearl runs: busy, idle, mutual waiting, Gantt PNGs
    (run_dir / "report.md").write_text("\n".join(md))
    return summary


def compare_runs(run_dirs: list[Path], out: Path) -> pd.DataFrame:
    """Side-by-side summary of several runs (a `label` column names each run folder)."""
    frames, runs, failed = [], [], []
    for d in run_dirs:
        s = write_run_report(Path(d))
        s.insert(0, "run", Path(d).name)
        frames.append(s)
        records = read_records(Path(d))
        runs.append((read_meta(Path(d)), records))
        bad = unexplained_mismatches(records)
        bad.insert(0, "run", Path(d).name)
        failed.append(bad)
    combined = pd.concat(frames, ignore_index=True)
    combined["label"] = combined.run + ":" + combined.method
    out.mkdir(parents=True, exist_ok=True)
    combined.drop(columns="label").to_csv(out / "comparison.csv", index=False)
    title = comparison_title(runs)
    write_plots(combined, out, title=title)
    cols = ["run", "method", "dataset", "prompts", "tokens_per_s", "speedup", "speedup_mean", "tau",
            "draft_ms_per_token", "lossless_rate", "lossless_explained_rate", "exactness"]
    bad = pd.concat(failed, ignore_index=True)
    md = ["# specbench comparison", "", f"{title}.", ""]
    if len(bad):
        md += ["## Lossless check FAILED", "", f"**{len(bad)} prompt turn(s) of lossless methods differ from `ar` "
               "where rounding does not explain it** (see each run's report.md).", "", markdown_table(bad), ""]
    md += [markdown_table(combined[cols]), "", LOSSLESS_TEXT, "",
           "![speedup](speedup.png)", "![tokens per second](tokens_per_s.png)", "![tau](tau.png)", ""]
    (out / "summary.md").write_text("\n".join(md))
    return combined


CATEGORY_COLUMNS = ["method", "dataset", "category", "prompts", "turns", "tokens_per_s", "speedup", "tau",
                    "draft_ms_per_token", "acceptance_rate", "lossless_rate", "lossless_explained_rate", "timing"]


def by_category(records: pd.DataFrame, summary: pd.DataFrame, latency_floor: float = 1.0) -> pd.DataFrame:
    """Per method x dataset x category (each against ar on the same category), then an `all` row per method x
    dataset (the overall summary): Spec-Bench reports per category. Empty when no record has a category."""
    if "category" not in records or not records.category.astype(str).str.len().any():
        return pd.DataFrame(columns=CATEGORY_COLUMNS)
    category = records.category.astype(str).replace("", "(none)")
    pairs = list(dict.fromkeys(zip(records.dataset, category)))  # (dataset, category) in first-seen order
    key = {pair: f"#{i}" for i, pair in enumerate(pairs)}
    split = summarize(records.assign(dataset=[key[p] for p in zip(records.dataset, category)]),
                      latency_floor=latency_floor)
    back = {k: pair for pair, k in key.items()}
    split["category"] = split.dataset.map(lambda k: back[k][1])
    split["dataset"] = split.dataset.map(lambda k: back[k][0])
    overall = summary.assign(category="all")
    table = pd.concat([split, overall], ignore_index=True)
    order = {m: i for i, m in enumerate(summary.method)}
    table = table.sort_values(["dataset", "category"], key=lambda c: c.map(lambda v: (v == "all", v))
                              if c.name == "category" else c, kind="stable")
    table = table.sort_values("method", key=lambda c: c.map(order), kind="stable")
    return table[[c for c in CATEGORY_COLUMNS if c in table]].reset_index(drop=True)


def category_section(records: pd.DataFrame, summary: pd.DataFrame, run_dir: Path, latency_floor: float) -> list[str]:
    """report.md's per-category table (and summary_by_category.csv), when the prompts have categories."""
    table = by_category(records, summary, latency_floor)
    if table.empty:
        return []
    table.to_csv(run_dir / "summary_by_category.csv", index=False)
    return ["## Per category", "", markdown_table(table), "",
            "Each category's speedup is against `ar` on the same category's prompts; `all` is the overall row "
            "(`summary_by_category.csv`). `specbench run --per-category --limit N` takes N prompts of each.", ""]


def is_partial(meta: dict) -> bool:
    """An interrupted run (run.yaml written by a specbench that records completion, and not complete)."""
    return meta.get("complete") is False


def tree_section(summary: pd.DataFrame, trees: dict, run_dir: Path, title: str = "") -> list[str]:
    """Tree methods: measured vs predicted tau and speedup per tree (PPD Fig. 8c when a run swept sizes), with
    tree_sizes.png for a sweep."""
    rows = []
    for label, info in trees.items():
        for _, r in summary[summary.method == label].iterrows():
            rows.append({"method": label, "dataset": r.dataset, "size": info.get("size"),
                         "predicted_tau": info.get("predicted_tau"), "tau": r.tau,
                         "predicted_speedup": info.get("predicted_speedup"), "speedup": r.speedup})
    if not rows:
        return []
    frame = pd.DataFrame(rows).sort_values(["dataset", "size"])
    frame.to_csv(run_dir / "tree_sizes.csv", index=False)
    profile = next((i.get("profile") for i in trees.values() if i.get("profile")), None)
    sources = list(dict.fromkeys(i.get("acceptance") for i in trees.values() if i.get("acceptance")))
    acceptance = next((a for a in sources if a.startswith("a generic")), sources[0] if sources else None)
    md = ["## Trees: measured vs predicted", "", markdown_table(frame), "",
          f"Predicted tau from {', '.join(sources) or 'the acceptance table'} (each method's own); predicted speedup from the latency profile "
          f"{profile or '(none for this hardware: run `specbench profile`)'}.", ""]
    if acceptance and acceptance.startswith("a generic"):
        md[-2:-1] = [f"**Predicted tau is not this model's**: it comes from {acceptance}; predicted speedup "
                     f"likewise. Profile: {profile or 'none for this hardware (run `specbench profile`)'}."]
    if frame["size"].nunique() >= 2:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for dataset, g in frame.groupby("dataset"):
            ax.plot(g["size"], g["speedup"], marker="o", label=f"measured ({dataset})")
        pred = frame.drop_duplicates("size")
        if pred["predicted_speedup"].notna().any():
            ax.plot(pred["size"], pred["predicted_speedup"], marker="x", linestyle="--", label="predicted")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xlabel("tree size n")
        ax.set_ylabel("speedup over ar")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
        ax.grid(alpha=0.3)
        set_title(ax, title, 6)
        fig.tight_layout()
        fig.savefig(run_dir / "tree_sizes.png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        md += ["![speedup per tree size](tree_sizes.png)", ""]
    return md

"""The summary of a run, computed from records.csv only (reports never re-run models): one row per method x
dataset x batch size x batching, each against ar on the same prompt turns, and the per-category table.

Speedup formulas (both from the same run, same prompts, same machine):
  speedup       = (sum new_tokens / sum wall_s)_method / (sum new_tokens / sum wall_s)_ar   (headline)
  speedup_mean  = mean over prompt turns of tokens_per_s_method / tokens_per_s_ar
  speedup_median = median over prompt turns of tokens_per_s_method / tokens_per_s_ar
  speedup_lo, speedup_hi = 95% bootstrap interval of speedup (prompts resampled, batch groups at B > 1, seeded:
                         run/intervals.py)
  tau           = sum new_tokens / sum target_forwards   (bonus token included; ar = 1.00)
  acceptance    = sum accepted_drafts / sum drafted
  draft_ms_per_token   = 1000 * sum draft_s / sum new_tokens   (drafting ms per emitted token; draft-model methods)
  draft_forwards_per_step = sum draft_forwards / sum target_forwards   (drafter forwards per target forward)
  decode_tokens_per_s  = sum (new_tokens - prefill_tokens) / sum (wall_s - prefill_s)   (batch > 1: EMS-SD §4.1's
                         incremental decoding, the prefill-only steps timed apart); decode_speedup: against ar's
  padding_ratio        = sum padding_tokens / sum target_tokens   (ours: padding's share of the tokens fed, <= 100%)
  kv_padding_ratio     = sum kv_padding / sum new_tokens   (EMS-SD's: padded KV entries per accepted token, can pass
                         100%; Appendix B's E[P] / E[A])
  sample_tokens_per_s  = sum new_tokens / sum latency_s   (tokens/s per sample, a request's view: each sample's tokens
                         over its own time in its batch, from joining it to its last token, prefill included; pooled
                         over samples; at batch 1 latency_s = wall_s, so it equals tokens_per_s)
  roofline_tok_s       = sum new_tokens / sum [new_tokens * (weight_bytes + kv_bytes_per_token * (prompt_tokens +
                         (new_tokens - 1) / 2)) / bandwidth]   (the memory-bandwidth bound of one-token-a-forward
                         decoding of the row's turns: report/roofline.py; run.yaml's roofline block; batch 1 only;
                         bandwidth: the turn's bandwidth_gb_s, read beside it on a CPU, else the run's reading)
  of_roofline          = tokens_per_s / roofline_tok_s   (ar's: how close the baseline is to the hardware)
  host_overhead        = sum host_s / sum wall_s over the turns that measured host_s (batch 1), where host_s =
                         wall_s - forward_s - draft_s: the time outside the target's forwards and the timed drafting
                         (masks, tree building, top-k, host syncs, acceptance; a method without a drafter model
                         drafts on the host). The denominator is the whole timed generation, prefill included
  compiled_forwards, eager_forwards = sum over the row's turns of its decode forwards (target and drafter, the
                         prompt's prefill aside) that ran through a compiled graph, and that ran eagerly (--compile
                         runs only: a width no bucket held, a hooked forward, a drafter or method off the static
                         engine); empty without --compile
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..core.store import RunFolder
from ..errors import SpecbenchError
from ..run import noise
from ..run.results import with_batch_columns
from ..run import intervals as robust
from . import csvcheck
from .lossless_check import exactness, explained_rate
from .serving import SUMMARY_SERVING, serving_numbers


FORMULAS = __doc__.split("Speedup formulas", 1)[1].strip()  # report.md's "Formulas" block


SUMMARY_COLUMNS = ["method", "dataset", "prompts", "turns", "new_tokens", "wall_s", "tokens_per_s", "speedup",
                   "speedup_lo", "speedup_hi", "speedup_median", "speedup_mean", "tau", "draft_ms_per_token",
                   "acceptance_rate", "drafted", "draft_forwards", "draft_s", "draft_forwards_per_step", "lossless_rate", "lossless_explained_rate", "exactness",
                   "peak_mem_mb", "extra_mem_mb", "forward_ms", "forward_ratio", "speedup_bound", "disturbed_time",
                   "timing", "batch_size", "batching", "target_tokens", "padding_tokens", "padding_ratio", "kv_padding",
                   "tau_batch_min", "tau_sample_mean", "decode_tokens_per_s", "decode_speedup", "kv_padding_ratio",
                   "sample_tokens_per_s", "roofline_tok_s", "of_roofline", "host_overhead", "compiled_forwards",
                   "eager_forwards", "decode_tau", "decode_step_ms"]

SUMMARY_COLUMNS += SUMMARY_SERVING  # time to first token, time per output token, inter-token latency (serving.py)


def read_records(run_dir: Path) -> pd.DataFrame:
    path = RunFolder(run_dir).records
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


def summarize(records: pd.DataFrame, temperature_greedy: bool = True, latency_floor: float = 1.0,
              roofline: dict | None = None) -> pd.DataFrame:
    """One row per method x dataset x batch size x batching (SUMMARY_COLUMNS). Each method is compared with ar at
    the same batch size on the prompt turns both finished (an interrupted run may hold more of one than of the
    other); the noise guard's verdict per row. At batch > 1 the speedup is a throughput ratio (a sample's wall_s is
    its share of its batch's time), and the plausibility bound is not applied (profiles are measured at batch 1)."""
    records = noise.flag_rows(with_batch_columns(records))  # per row: disturbed by /proc, outlier or the run
    parts = []
    for size, part in records.groupby("batch_size", sort=True):
        if size == 1:
            parts.append(_summarize(part, latency_floor, roofline).assign(batch_size=1, batching="-"))
            continue
        # one label per method x mode; ar (one mode per batch size) stays "ar", every method's reference
        labels = [m if m == "ar" else f"{m}|{b}" for m, b in zip(part.method, part.batching)]
        summary = _summarize(part.assign(method=labels), None)
        ar_mode = part.batching[part.method == "ar"].iloc[0] if (part.method == "ar").any() else "-"
        split = summary.method.str.split("|")
        parts.append(summary.assign(method=split.str[0], batch_size=int(size),
                                    batching=split.map(lambda x: x[1] if len(x) > 1 else ar_mode)))
    return pd.concat(parts, ignore_index=True)[SUMMARY_COLUMNS]


def _summarize(records: pd.DataFrame, latency_floor: float | None, roofline: dict | None = None) -> pd.DataFrame:
    """summarize() for one batch size; latency_floor None: no plausibility bound; roofline: run.yaml's block
    (batch 1 only: report/roofline.py's bound is one sequence's)."""
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
        pairs = robust.turn_pairs(g, ar_d, turn_key)
        low, high = robust.interval(pairs)
        checked = g.lossless[g.lossless.astype(str) != ""]
        drafted = g.drafted.sum() if "drafted" in g else 0
        peak = g.peak_mem_mb.max() if "peak_mem_mb" in g else math.nan
        ar_peak = ar_d.peak_mem_mb.max() if "peak_mem_mb" in ar_d and len(ar_d) else math.nan
        fwd = g.wall_s.sum() / max(g.target_forwards.sum(), 1)  # seconds per target forward
        ar_fwd = ar_d.wall_s.sum() / max(ar_d.target_forwards.sum(), 1) if len(ar_d) else math.nan
        rows.append({
            "method": method, "dataset": dataset, "prompts": g.prompt_id.nunique(), "turns": len(g),
            "new_tokens": int(g.new_tokens.sum()), "wall_s": round(g.wall_s.sum(), 3),
            "tokens_per_s": round(tps, 2), "speedup": tps / ar_tps, "speedup_lo": round(low, 3),
            "speedup_hi": round(high, 3), "speedup_median": round(robust.median_ratio(pairs), 3),
            "speedup_mean": round(ratios.mean(), 3) if ratios.notna().any() else math.nan,
            "tau": g.new_tokens.sum() / g.target_forwards.sum() if g.target_forwards.sum() > 0 else math.nan,
            "acceptance_rate": round(g.accepted_drafts.sum() / drafted, 3) if drafted else math.nan,
            "lossless_rate": round((checked == "match").mean(), 3) if len(checked) else math.nan,
            "lossless_explained_rate": explained_rate(g),
            "exactness": exactness(method), "peak_mem_mb": peak,
            "extra_mem_mb": round(peak - ar_peak, 1) if not math.isnan(peak) and not math.isnan(ar_peak) else math.nan,
            "forward_ms": round(fwd * 1e3, 3), "forward_ratio": round(fwd / ar_fwd, 3) if ar_fwd > 0 else math.nan,
            **_draft_numbers(g), **_batch_numbers(g), **_decode_numbers(g, ar_d), **serving_numbers(g),
            **decode_steps(g),
            "sample_tokens_per_s": sample_rate(g), **_roofline_numbers(g, tps, roofline),
            "compiled_forwards": _count_sum(g, "compiled_forwards"), "eager_forwards": _count_sum(g, "eager_forwards"),
        })
    summary = pd.DataFrame(rows, columns=[c for c in SUMMARY_COLUMNS if c not in NOISE_COLUMNS + ("batch_size",
                                                                                                 "batching")])
    return noise.judge(summary, records, latency_floor).round({"speedup": 3, "tau": 3})  # judged unrounded


NOISE_COLUMNS = ("speedup_bound", "disturbed_time", "timing")  # added by noise.judge


def _count_sum(g: pd.DataFrame, column: str) -> float:
    """The column's sum over the rows that have it; NaN where none has it (a run without --compile)."""
    values = pd.to_numeric(g[column], errors="coerce") if column in g else pd.Series(dtype=float)
    return float(values.sum()) if values.notna().any() else math.nan


def _roofline_numbers(g: pd.DataFrame, tps: float, block: dict | None) -> dict:
    """roofline_tok_s, of_roofline and host_overhead of one summary row (report/roofline.py)."""
    from . import roofline

    bound, host = roofline.bound_tok_s(g, block), roofline.host_overhead(g)
    return {"roofline_tok_s": round(bound, 2) if math.isfinite(bound) else math.nan,
            "of_roofline": round(tps / bound, 3) if math.isfinite(bound) and bound > 0 else math.nan,
            "host_overhead": round(host, 4) if math.isfinite(host) else math.nan}


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
    tau = g.new_tokens / g.target_forwards.where(g.target_forwards > 0)  # NaN where unknown (a server's rows)
    batch = g["batch_id"].astype(str) if "batch_id" in g else g.prompt_id.astype(str)
    batch = batch.where(~batch.isin(["", "nan"]), g.prompt_id.astype(str) + "/" + g.turn.astype(str))
    return {"target_tokens": int(target), "padding_tokens": int(padding),
            "padding_ratio": round(padding / target, 4) if target else math.nan,
            "kv_padding": int(pd.to_numeric(g.get("kv_padding", 0), errors="coerce").sum()),
            "tau_batch_min": round(tau.groupby(batch.values).min().mean(), 3), "tau_sample_mean": round(tau.mean(), 3)}


def decode_rate(g: pd.DataFrame) -> float:
    """Tokens per second of incremental decoding (EMS-SD §4.1): new tokens but those the prefill-only steps emitted,
    over the time but those steps'. NaN where prefill was not timed apart (batch 1, runs older than prefill_s)."""
    if "prefill_s" not in g:
        return math.nan
    prefill = pd.to_numeric(g.prefill_s, errors="coerce")
    if g.empty or prefill.isna().any():
        return math.nan
    first = _total(g, "prefill_tokens")
    seconds = g.wall_s.sum() - prefill.sum()
    return (g.new_tokens.sum() - first) / seconds if seconds > 0 else math.nan


def sample_rate(g: pd.DataFrame) -> float:
    """Tokens/s per sample: new tokens over the samples' own times in their batches (latency_s), pooled. NaN for
    records older than latency_s (or with a blank one)."""
    if "latency_s" not in g:
        return math.nan
    latency = pd.to_numeric(g.latency_s, errors="coerce")
    if g.empty or latency.isna().any() or latency.sum() <= 0:
        return math.nan
    return round(float(g.new_tokens.sum() / latency.sum()), 2)


def _total(g: pd.DataFrame, column: str) -> float:
    """Sum of a numeric column (0 where the records lack it: runs older than the column, blank cells)."""
    return float(pd.to_numeric(g[column], errors="coerce").fillna(0).sum()) if column in g else 0.0


def decode_steps(g: pd.DataFrame) -> dict:
    """The decode steps alone (the prefill's forward yields a turn's first token and is not a step): decode_tau =
    (new tokens - 1) / (target forwards - 1) and decode_step_ms = (wall_s - ttft_s) / (target forwards - 1), summed
    over the turns; NaN where the rows have no first-token time or no decode step (the step time also for batched
    rows)."""
    forwards = pd.to_numeric(g.target_forwards, errors="coerce")
    ttft = pd.to_numeric(g.get("ttft_s", pd.Series(math.nan, index=g.index)), errors="coerce")
    steps = (forwards - 1).clip(lower=0)
    if steps.sum() <= 0:
        return {"decode_tau": math.nan, "decode_step_ms": math.nan}
    tau = (g.new_tokens - 1).clip(lower=0).sum() / steps.sum()
    batched = "batch_size" in g and (pd.to_numeric(g.batch_size, errors="coerce").fillna(1) != 1).any()
    # a batched row's wall_s is its share of the batch's time, not its own: no step time of its own
    seconds = (g.wall_s - ttft).sum() if ttft.notna().all() and not batched else math.nan
    return {"decode_tau": round(tau, 4),
            "decode_step_ms": round(seconds * 1e3 / steps.sum(), 4) if math.isfinite(seconds) else math.nan}


def _decode_numbers(g: pd.DataFrame, ar: pd.DataFrame) -> dict:
    """Decode-only throughput and its ratio to ar's on the same turns, and EMS-SD's padding ratio."""
    rate, ar_rate = decode_rate(g), decode_rate(ar)
    ratio = rate / ar_rate if ar_rate > 0 else math.nan  # NaN > 0 is False
    kv = _total(g, "kv_padding")
    new = g.new_tokens.sum()
    return {"decode_tokens_per_s": round(rate, 2) if math.isfinite(rate) else math.nan,
            "decode_speedup": round(ratio, 3) if math.isfinite(ratio) else math.nan,
            "kv_padding_ratio": round(kv / new, 4) if new else math.nan}


def row_name(r) -> str:
    """A summary row's name: the method, with its batch size and batching mode at batch > 1 ("sd B=8 unpadded")."""
    try:
        size = int(float(getattr(r, "batch_size", 1)))
    except (TypeError, ValueError):  # a hand-made or older summary: one prompt at a time
        size = 1
    if size == 0:  # an open loop (a server run's --request-rate): no batch size, its arrivals name it
        return f"{r.method} {r.batching}"
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


CATEGORY_COLUMNS = ["method", "dataset", "category", "prompts", "turns", "tokens_per_s", "speedup", "speedup_lo",
                    "speedup_hi", "tau",
                    "draft_ms_per_token", "acceptance_rate", "lossless_rate", "lossless_explained_rate", "timing"]


def by_category(records: pd.DataFrame, summary: pd.DataFrame, latency_floor: float = 1.0) -> pd.DataFrame:
    """Per method x dataset x category (each against ar on the same category), then an `all` row per method x
    dataset (the overall summary): Spec-Bench reports per category. Empty when no record has a category."""
    if "category" not in records or not records.category.astype(str).str.len().any():
        return pd.DataFrame(columns=CATEGORY_COLUMNS)
    records = noise.flag_rows(with_batch_columns(records))  # outliers judged against the whole run, not a category
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

"""The roofline of a run: the fastest a forward can be when it only has to read its bytes from memory
once, and how far `ar` is from it, and why.

A decoding forward at batch 1 reads every weight once, plus the KV cache of its context:
    bytes(c)   = weight_bytes + kv_bytes_per_token * c
    floor(c)   = bytes(c) / bandwidth                     (seconds; bandwidth: core/machine/bandwidth.py, measured
                                                           in the run's own sitting: for_run; on a CPU, read
                                                           beside each turn: records' bandwidth_gb_s,
                                                           run/turn_bandwidth.py)
A turn of n new tokens from a p-token prompt needs at least n forwards (the prefill's gives the first token), at
contexts p .. p + n - 1 (mean p + (n - 1) / 2), so over a summary row's turns
    roofline_tok_s = sum n / sum [n * floor(p + (n - 1) / 2)]
i.e. the bound on tokens per second of one-token-a-forward decoding of those very turns (prefill's arithmetic
ignored: a bound, never beatable). `of_roofline` = a row's tokens_per_s / roofline_tok_s (ar's: how close the
baseline is to the hardware; another method's can pass 1, by emitting more than a token a forward).

weight_bytes: every parameter once (tied ones once), in the dtype it is stored in, but the input embedding table
when it is not the LM head too (a forward gathers only its rows). kv_bytes_per_token: layers x 2 (K and V) x KV heads
x head dim x the dtype's bytes (sliding windows not modelled: a bound for full attention).

Why `ar` is where it is, from this hardware's latency profile L(w) (ms per forward of w new tokens, at the KV
length nearest the run's context) and the floor, with L(w) read as a line a + b w through L(1) and L(k) (k: the
widest profiled width up to 16):
    compute   = b = (L(k) - L(1)) / (k - 1)   per-token work: grows with the width (arithmetic; 0 .. L(1))
    fixed     = L(1) - b                      per-forward cost whatever the width
    bandwidth = min(floor, fixed)             the part of it that reading the bytes explains
    launch    = fixed - bandwidth             the rest: kernel launches, framework dispatch, Python per forward
and ar is called bandwidth-bound, compute-bound or launch-bound after the largest of the three shares of L(1).
Without a profile only the distance is said; where L(1) is below the floor (impossible but for a bandwidth measured
low, on a busy machine) the line says so instead.
"""

from __future__ import annotations

import math

import pandas as pd

from ..core.machine.roofline import (  # noqa: F401  (the bytes and run.yaml's block live in core; re-exported)
    WIDTH_UP_TO, dtype_bytes, floor_s, kv_bytes_per_token, mean_context, profile_points, run_block, weight_bytes)


# ---------------------------------------------------------------------------------------- summary.csv columns

def bound_tok_s(records: pd.DataFrame, block: dict | None) -> float:
    """roofline_tok_s of a summary row's records (module docstring); NaN without a block or its columns."""
    if not block or records.empty or not {"prompt_tokens", "new_tokens"} <= set(records):
        return math.nan
    try:
        p = pd.to_numeric(records.prompt_tokens, errors="coerce")
        n = pd.to_numeric(records.new_tokens, errors="coerce")
        seconds = (n * ((block["weight_bytes"] + block["kv_bytes_per_token"] * (p + (n - 1) / 2))
                        / (turn_bandwidth(records, block) * 1e9))).sum()
    except (KeyError, TypeError, ValueError):
        return math.nan
    return float(n.sum() / seconds) if seconds > 0 else math.nan


def turn_bandwidth(records: pd.DataFrame, block: dict) -> pd.Series:
    """GB/s per record: the reading beside its turn (records.csv's bandwidth_gb_s, run/turn_bandwidth.py) where it
    has one, else the run's (the block's, read before the turns)."""
    run = float(block["bandwidth_gb_s"])
    if "bandwidth_gb_s" not in records:
        return pd.Series(run, index=records.index)
    beside = pd.to_numeric(records.bandwidth_gb_s, errors="coerce")
    return beside.where(beside > 0, run)


def beside_range(records: pd.DataFrame) -> tuple[float, float, float] | None:
    """(mean, lowest, highest) of the bandwidth read beside the records' turns, GB/s; None where none was read."""
    if "bandwidth_gb_s" not in records:
        return None
    beside = pd.to_numeric(records.bandwidth_gb_s, errors="coerce")
    beside = beside[beside > 0]
    return (float(beside.mean()), float(beside.min()), float(beside.max())) if len(beside) else None


def host_overhead(records: pd.DataFrame) -> float:
    """sum host_s / sum wall_s over the row's records that measured host_s (batch 1's turns, prefill included in
    both: the whole timed generation); NaN where none did."""
    if "host_s" not in records:
        return math.nan
    host = pd.to_numeric(records.host_s, errors="coerce")
    known = host.notna()
    wall = pd.to_numeric(records.wall_s[known], errors="coerce").sum()
    return float(host[known].sum() / wall) if known.any() and wall > 0 else math.nan


# --------------------------------------------------------------------------------------------------- verdict

def shares(block: dict) -> dict | None:
    """{bandwidth, compute, launch} ms of L(1) (module docstring), or None without a profile in the block."""
    l1, lk, k = block.get("profile_l1_ms"), block.get("profile_lk_ms"), block.get("profile_width")
    if not l1 or not lk or not k or k <= 1:
        return None
    compute = min(max((lk - l1) / (k - 1), 0.0), l1)  # (at most all of L(1): a superlinear curve)
    fixed = l1 - compute
    bandwidth = min(block["bound_ms"], fixed)
    return {"bandwidth": bandwidth, "compute": compute, "launch": fixed - bandwidth}


def why(block: dict) -> tuple[str, str]:
    """(kind, reason): kind is bandwidth-bound, compute-bound, launch-bound or "" (no profile)."""
    parts = shares(block)
    if parts is None:
        return "", "no latency profile of this hardware to say why (`specbench profile` measures one)"
    kind = max(parts, key=parts.get)
    l1, lk, k = block["profile_l1_ms"], block["profile_lk_ms"], block["profile_width"]
    if l1 < block["bound_ms"]:  # a bare forward beat the floor: the bandwidth was measured low (a busy machine)
        return "", (f"this hardware's profile has L(1) {l1:.2f} ms, below the {block['bound_ms']:.2f} ms floor: the "
                    f"bandwidth was measured low (a busy machine?); `specbench env --measure-bandwidth` on a quiet "
                    f"machine measures it again")
    said = (f"L(1) {l1:.2f} ms = {parts['bandwidth']:.2f} reading the bytes + {parts['launch']:.2f} fixed "
            f"per-forward overhead + {parts['compute']:.2f} per-token compute (L({k})/L(1) = {lk / l1:.2f})")
    return f"{kind}-bound", said


def verdict_line(summary: pd.DataFrame, block: dict | None, records: pd.DataFrame | None = None) -> str | None:
    """One sentence: ar's tokens/s against its roofline, and why (or None without ar or a roofline); `records`
    (records.csv) says the bandwidth read beside ar's turns where they have it."""
    if not block or "roofline_tok_s" not in summary:
        return None
    ar = summary[(summary.method == "ar") & (summary.get("batch_size", 1) == 1)]
    if ar.empty or not math.isfinite(float(ar.roofline_tok_s.iloc[0])):
        return None
    ar = ar[ar.roofline_tok_s.map(lambda v: math.isfinite(float(v)))]
    tokens = float(ar.new_tokens.sum())  # pooled over datasets: total tokens over total (bound) time
    tps, bound = tokens / float(ar.wall_s.sum()), tokens / float((ar.new_tokens / ar.roofline_tok_s).sum())
    kind, reason = why(block)
    measured = ar[ar.host_overhead.notna()] if "host_overhead" in ar else ar.iloc[0:0]
    host = float((measured.host_overhead * measured.wall_s).sum() / measured.wall_s.sum()) if len(measured) \
        else math.nan
    host_text = f"; {host:.1%} of its time is host overhead outside the forwards" if math.isfinite(host) else ""
    beside = beside_range(ar_records(records)) if records is not None else None
    host_text += prefill_text(ar, block, beside[0] if beside else None)
    mb = (block["weight_bytes"] + block["kv_bytes"]) / 1e6
    if beside:  # each turn against the bandwidth read beside it (run/turn_bandwidth.py)
        at = (f"the bandwidth read beside each of its turns, {beside[0]:.1f} GB/s on average ({beside[1]:.1f}-"
              f"{beside[2]:.1f}); the run read {block['bandwidth_gb_s']:.1f} GB/s before its turns"
              + (f" and {block['bandwidth_after_gb_s']:.1f} after them" if block.get("bandwidth_after_gb_s") else ""))
    else:
        at = f"{block['bandwidth_gb_s']:.1f} GB/s{reading(block)}{after_text(block, tps / bound)}"
    stale = stale_text(block, decode_step_ms(ar)) if kind else ""
    return (f"`ar` runs at {tps:.1f} tok/s, {tps / bound:.3g} of its roofline ({bound:.1f} tok/s: {mb:.0f} MB a "
            f"forward at {at}){host_text}; {kind + ': ' if kind else ''}{reason}{stale}.")


def ar_records(records: pd.DataFrame) -> pd.DataFrame:
    """records.csv's rows of `ar` at batch 1."""
    rows = records[records.method == "ar"]
    return rows[pd.to_numeric(rows.batch_size, errors="coerce").fillna(1) == 1] if "batch_size" in rows else rows


def after_text(block: dict, ratio: float) -> str:
    """'; 0.71 of it at the 61.0 GB/s measured after its turns' where run.yaml holds a second reading (the bound
    scales with the bandwidth), else ''."""
    after = block.get("bandwidth_after_gb_s")
    if not after or not block.get("bandwidth_gb_s"):
        return ""
    source = str(block.get("bandwidth_after_source", ""))
    note = "" if source.startswith("measured now") else f" ({source})"
    return (f"; {ratio * block['bandwidth_gb_s'] / after:.3g} of it at the {after:.1f} GB/s measured after its "
            f"turns{note}")


def prefill_text(ar: pd.DataFrame, block: dict, gb_s: float | None = None) -> str:
    """What the bound does not see, from the serving columns: the prompt's prefill (arithmetic the bound ignores)
    as a share of ar's time, and the decode-only time per token (tpot p50) against the floor of one forward (at
    `gb_s`, the mean bandwidth read beside the turns, where given; else the block's)."""
    if not {"ttft_p50_s", "turns", "tpot_p50_ms"} <= set(ar):
        return ""
    ttft, tpot = pd.to_numeric(ar.ttft_p50_s, errors="coerce"), pd.to_numeric(ar.tpot_p50_ms, errors="coerce")
    known = ttft.notna() & tpot.notna()
    if not known.any():
        return ""
    share = float((ttft[known] * ar.turns[known]).sum() / ar.wall_s[known].sum())
    step = decode_step_ms(ar)
    floor = block["bound_ms"] * (block["bandwidth_gb_s"] / gb_s if gb_s else 1.0)
    return (f"; its prefill takes about {share:.1%} of its time (median time to first token "
            f"{float(ttft[known].median()) * 1e3:.0f} ms); decoding alone, {step:.2f} ms a token (tpot p50) against "
            f"the {floor:.2f} ms floor, {floor / step:.3g} of the roofline")


def decode_step_ms(ar: pd.DataFrame) -> float:
    """ar's decode-only ms a token: its rows' tpot p50 weighted by their tokens (NaN without the column)."""
    if not {"tpot_p50_ms", "new_tokens"} <= set(ar):
        return math.nan
    tpot = pd.to_numeric(ar.tpot_p50_ms, errors="coerce")
    known = tpot.notna() & (ar.new_tokens > 0)
    return float((tpot[known] * ar.new_tokens[known]).sum() / ar.new_tokens[known].sum()) if known.any() else math.nan


STALE = 1.3  # a profile's L(1) this many times ar's measured step (or 1 / this) is of another machine state


def stale_text(block: dict, step_ms: float) -> str:
    """A warning where this hardware's profile L(1) and ar's measured decode step disagree by STALE or more (a
    profile taken on another chip under the same hardware key (the block's `profile_chip` against `chip`), an older
    build, another thread count or a loaded machine: the split above, the trees it sized and the predictions read
    it), else ''. Seen on a Zen 5 EPYC: the shipped eager profile, a Zen 4's, read L(1) = 45.46 ms against a run's
    21.05 ms a token (benchmarks/RESULTS-cpu.md, stop 69)."""
    l1 = block.get("profile_l1_ms")
    if not l1 or not math.isfinite(step_ms) or step_ms <= 0 or 1 / STALE < l1 / step_ms < STALE:
        return ""
    theirs, mine = block.get("profile_chip"), block.get("chip")
    source = (f"it was measured on another chip under the same hardware key ({theirs}; this one: {mine})"
              if theirs and mine and theirs != mine else "it is of another state of this machine or an older build")
    return (f". But that profile's L(1), {l1:.2f} ms, is {l1 / step_ms:.2f}x the {step_ms:.2f} ms a token ar "
            f"decoded at here: {source}, and the trees it sized and the predictions read it too; `specbench profile` "
            f"(the run's --dtype, and --compile for a compiled run) measures it again")


def reading(block: dict) -> str:
    """Which bandwidth reading the roofline divides by and when (', measured now, before this run's turns, at
    2026-11-27T13:24:22Z'), or '' where the block does not say (an older run)."""
    source, at = block.get("bandwidth_source"), block.get("bandwidth_measured_at")
    return (f", {source}" if source else "") + (f", at {at}" if at and source and not source.startswith("$") else "")

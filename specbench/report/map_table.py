"""The map of a batch-size sweep (`specbench map`, or any run with two or more batch sizes): per dataset, method label
and batch size B, the measured decode throughput beside the cost model's prediction from L(B, w)
(planning/batch_prediction.py), the speedup over `ar` at the same B, per-user tokens/s, and the break-even batch
size where the method stops beating `ar`. Computed from records.csv, summary.csv, run.yaml and the latency profile
the run used (the copy in the run folder, else the file run.yaml names); never re-runs a model.

What the prediction takes from the run, per (label, B), averaged over its decode steps (the prefill is not a step):
  width   = sum (target_tokens - prompt_tokens) / sum (target_forwards - 1)   new tokens per sample per forward
  tau     = sum (new_tokens - 1) / sum (target_forwards - 1)                   tokens per sample per step
  rates   = the per-position acceptance (accepted_per_position pooled), as rates over every step (chain_rates)
  draft   = drafting seconds / steps (a batch's drafting: the sum of its rows' shares)
  host    = the label's host seconds outside the forwards per decode step at batch 1 (host_s), charged per row
  draft forwards = a draft-model method's drafter forwards per step (draft_forwards / target_forwards)
  draft host = a draft-model method's drafting per step at batch 1 less its drafter curve's price of it (its cache
            rolled back, its segments built: draft_host_ms), charged per step (one batched drafting, whatever its rows)
  kv      = mean prompt tokens + half the mean new tokens
and each batch's samples' decode lengths (new_tokens - 1). The predicted steps of a batch are the expected maximum
over its samples of a seeded simulation from the rates (planning/batch_prediction.simulate_batch), each step priced
at L(rows still decoding, w, kv) + drafting + host work per row. A draft-model method's drafting is priced on its
drafter's own curve L_d(rows, w) measured on the spot (DRAFT_COPY): its drafter forwards per step over the rows
still decoding (planning/batch_prediction.DraftCost), plus its drafting host work per step; other methods' drafting
is the run's measured one per step.
The predicted ms per batch step splits into `forward_ms_predicted`, `draft_ms_predicted` and `host_ms_predicted`
(`draft_priced` says how the drafting was priced). The error splits into its steps part (`steps_error`: predicted batch
steps over measured, max(target_forwards) - 1 per batch) and its step-cost part (`step_cost_error`: predicted ms per
batch step over measured decode ms per batch step); tok/s error = 1 / ((1 + steps_error) (1 + step_cost_error)) - 1.
The step costs are read from the profile measured on the spot after the run on the run's own engines and widths
(planning/spot_profile.py, STEP_COPY) when the run folder has it, else from the profile the run used. `tau_file`
gives the acceptance file's tau where the run had one for the label (batch 1's tree).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from ..core import store
from ..core.lookup import EAGER_FOR_COMPILED
from ..core.profile_file import LatencyProfile, load_profile
from ..errors import SpecbenchError
from ..planning.batch_prediction import (DraftCost, batch_cost, break_even, chain_rates, first_draft_width,
                                         simulate_batch)

NUMERIC = ("target_forwards", "target_tokens", "prompt_tokens", "new_tokens", "draft_s", "latency_s", "wall_s",
           "ttft_s", "batch_wall_s", "prefill_s", "prefill_tokens", "tpot_ms")
PROFILE_COPY = "latency_profile.yaml"  # the profile `specbench map` measured before its run, kept in the run folder
STEP_COPY = "step_profile.yaml"  # L(B, w) measured after the run on its engines at its grid's widths (spot_profile)
DRAFT_COPY = "draft_profile.yaml"  # a drafter model's L_d(B, w) measured beside STEP_COPY on the drafter's engines
TRIALS = 200  # simulated batches per point
GOAL = 0.10  # the cost model's goal: predicted within 10% of measured

COLUMNS = ["dataset", "batch_size", "method", "setting", "mode", "width", "tau", "tau_file", "draft_ms_per_step",
           "host_ms_per_row", "draft_host_ms", "kv", "draft_forwards_per_step", "draft_priced", "steps_predicted",
           "steps_measured", "step_ms_predicted", "step_ms_measured", "forward_ms_predicted", "draft_ms_predicted",
           "host_ms_predicted", "steps_error", "step_cost_error", "predicted_tok_s", "measured_tok_s", "error",
           "within_goal",
           "per_user_tok_s", "predicted_speedup", "measured_speedup", "break_even", "break_even_predicted",
           "best_at_batch", "timing"]


def has_sweep(records: pd.DataFrame) -> bool:
    """Two or more batch sizes in the run: what a map is drawn from."""
    return "batch_size" in records and pd.to_numeric(records.batch_size, errors="coerce").nunique() >= 2


def run_profile(run_dir: Path, meta: dict) -> tuple[LatencyProfile | None, str]:
    """(the latency profile the run predicted from, where it came from) or (None, why none)."""
    if (meta.get("settings") or {}).get("engine") == "openai":
        return None, "a server's latency curve is not profiled here: measured only"
    spot = Path(run_dir) / STEP_COPY
    if spot.exists():
        return load_profile(spot), (f"{STEP_COPY} (measured after the run on its engines, at the widths and KV "
                                    "lengths of its grid)")
    copy = Path(run_dir) / PROFILE_COPY
    if copy.exists():
        return load_profile(copy), f"{PROFILE_COPY} (the run's copy)"
    stood_in = False
    for entry in (meta.get("data_files") or {}).get("used") or []:
        if entry.get("kind") == "profile" and EAGER_FOR_COMPILED in (entry.get("flags") or []):
            stood_in = True  # a compiled run's steps are not eager decoding's: no prediction from that curve
            continue
        if entry.get("kind") == "profile" and entry.get("path"):
            path = Path(entry["path"]) if Path(entry["path"]).exists() else store.find(entry["path"])
            if path is not None and Path(path).exists():
                try:
                    return load_profile(path), str(entry["path"])
                except SpecbenchError:
                    continue
    if stood_in:
        return None, ("the run was compiled and this hardware has no compiled profile (an eager one stood in): "
                      "`specbench profile --compile --batch-size ...` files one")
    return None, "no latency profile recorded for this run (run `specbench profile --batch-size ...`)"


def _mode_rows(records: pd.DataFrame) -> pd.DataFrame:
    """Batch 1, and at B > 1 the unpadded rows (the engine L(B, w) is timed on); padded ones only where a batch size
    ran padded alone."""
    r = records.assign(batch_size=pd.to_numeric(records.batch_size, errors="coerce").fillna(1).astype(int),
                       batching=records.get("batching", pd.Series("-", index=records.index)).fillna("-"))
    for column in NUMERIC:
        r[column] = pd.to_numeric(r[column], errors="coerce") if column in r else math.nan
    keep = (r.batch_size == 1) | r.batching.isin(["unpadded", "closed"])  # closed: a server's N in flight
    padded_only = {b for b, g in r[r.batch_size > 1].groupby("batch_size") if not (g.batching == "unpadded").any()}
    return r[keep | r.batch_size.isin(padded_only)]


def _step_numbers(g: pd.DataFrame, size: int) -> dict:
    """width, tau, drafting ms per step, kv and measured decode tok/s of one (label, B) group of records."""
    num = lambda c: pd.to_numeric(g[c], errors="coerce").fillna(0)  # noqa: E731
    steps = (num("target_forwards") - 1).clip(lower=0)
    n_steps = float(steps.sum())
    out = {"width": float((num("target_tokens") - num("prompt_tokens")).sum()) / n_steps if n_steps else math.nan,
           "tau": float((num("new_tokens") - 1).clip(lower=0).sum()) / n_steps if n_steps else math.nan,
           "kv": int(round(num("prompt_tokens").mean() + num("new_tokens").mean() / 2))}
    decode_s = math.nan
    if (g.batching == "closed").any():  # a server's level: each row's wall_s is its share of the level's time
        wall = float(num("wall_s").sum())
        out["measured_tok_s"] = float(num("new_tokens").sum()) / wall if wall > 0 else math.nan
        draft_s, drafted_steps = 0.0, 0.0
    elif size == 1:
        draft_s, drafted_steps = float(num("draft_s").sum()), n_steps
        decode_s = float((num("latency_s" if "latency_s" in g else "wall_s") - num("ttft_s")).sum())
        out["measured_tok_s"] = float((num("new_tokens") - 1).clip(lower=0).sum()) / decode_s if decode_s > 0 else math.nan
    else:  # wall time is per batch, repeated on each sample's row; drafting and the prefill-only time are shared
        # out among the rows (each row holds its share: the batch's is their sum)
        batches = g.groupby("batch_id", dropna=False)
        draft_s = float(num("draft_s").sum())
        drafted_steps = float((batches.target_forwards.max() - 1).clip(lower=1).sum())
        decode_s = float(batches.batch_wall_s.first().sum()) - float(num("prefill_s").sum())
        decoded = float((num("new_tokens") - num("prefill_tokens")).sum())
        out["measured_tok_s"] = decoded / decode_s if decode_s > 0 else math.nan
    out["draft_ms_per_step"] = 1000.0 * draft_s / drafted_steps if drafted_steps else 0.0
    forwards = float(num("target_forwards").sum())
    out["draft_forwards_per_step"] = float(num("draft_forwards").sum()) / forwards \
        if "draft_forwards" in g and forwards else 0.0
    out["steps_measured"] = drafted_steps if drafted_steps else math.nan
    out["step_ms_measured"] = 1000.0 * decode_s / drafted_steps if drafted_steps and decode_s > 0 else math.nan
    if not n_steps and not math.isfinite(out.get("measured_tok_s", math.nan)):
        return {}
    tpot = pd.to_numeric(g.get("tpot_ms"), errors="coerce")
    out["per_user_tok_s"] = float((1000.0 / tpot[tpot > 0]).mean()) if tpot is not None and (tpot > 0).any() \
        else math.nan
    return out


def accepted_counts(g: pd.DataFrame) -> list[int] | None:
    """Accepted drafts per position pooled over a group's records (accepted_per_position: "a/d a/d ..." per turn),
    None when no record has them."""
    if "accepted_per_position" not in g:
        return None
    totals: list[int] = []
    seen = False
    for text in g.accepted_per_position.dropna().astype(str):
        pairs = re.findall(r"(\d+)/(\d+)", text)
        seen = seen or bool(pairs)
        for i, (accepted, _) in enumerate(pairs):
            if i == len(totals):
                totals.append(0)
            totals[i] += int(accepted)
    return totals if seen else None


def _batches(g: pd.DataFrame, size: int) -> list[list[int]]:
    """The decode lengths (new_tokens - 1) of each batch's samples: one sample a batch at B = 1."""
    lengths = (pd.to_numeric(g.new_tokens, errors="coerce").fillna(1) - 1).clip(lower=0).astype(int)
    if size == 1 or "batch_id" not in g:
        return [[n] for n in lengths]
    return [list(part) for _, part in lengths.groupby(g.batch_id.fillna("-"), sort=True)]


def host_ms_per_row(g: pd.DataFrame) -> float:
    """ms of host work per decode step of one sample (host_s: the time outside the target's forwards) in a batch-1
    group, 0 where the records do not say."""
    if "host_s" not in g:
        return 0.0
    host = pd.to_numeric(g.host_s, errors="coerce")
    steps = (pd.to_numeric(g.target_forwards, errors="coerce") - 1).clip(lower=0)
    ok = host.notna() & steps.gt(0)
    return 1000.0 * float(host[ok].sum()) / float(steps[ok].sum()) if ok.any() else 0.0


def _rates(g: pd.DataFrame) -> list[float] | None:
    """A group's per-position acceptance as rates over every decode step (chain_rates), None without counts."""
    steps = float((pd.to_numeric(g.target_forwards, errors="coerce").fillna(1) - 1).clip(lower=0).sum())
    counts = accepted_counts(g)
    return chain_rates(counts, int(steps)) if counts is not None and steps > 0 else None


def _draft_cost(g: pd.DataFrame, numbers: dict, drafter: LatencyProfile | None,
                host_ms: float = 0.0) -> DraftCost | None:
    """A draft-model method's drafting on its drafter's curve, None without a curve or drafter forwards."""
    forwards = numbers.get("draft_forwards_per_step", 0.0)
    if drafter is None or forwards <= 0:
        return None
    return DraftCost(drafter, forwards, first_draft_width(_rates(g), forwards), numbers["kv"], host_ms)


def draft_host_ms(g: pd.DataFrame, numbers: dict, drafter: LatencyProfile | None) -> float:
    """ms a step of a draft-model method's drafting outside its drafter's forwards (rolling caches back, building
    segments): a batch-1 group's drafting as measured less the drafter curve's price of its forwards; 0 without a
    curve, or where the curve prices more than was measured."""
    cost = _draft_cost(g, numbers, drafter)
    priced = cost.ms(1.0) if cost is not None else None
    return max(0.0, numbers.get("draft_ms_per_step", 0.0) - priced) if priced is not None else 0.0


def predict(g: pd.DataFrame, size: int, numbers: dict, profile: LatencyProfile, host_ms: float = 0.0,
            drafter: LatencyProfile | None = None, draft_host_ms: float = 0.0) -> dict:
    """The point's predicted batch steps, ms per batch step (and its parts) and tok/s (NaN where a curve has no
    point for it): every batch simulated from the group's per-position rates (the constant tau where the records
    have none). `drafter`: the drafter's L_d(B, w), pricing a draft-model method's drafting (None: as measured),
    with `draft_host_ms` of drafting host work a step beside its forwards."""
    nan = {"steps_predicted": math.nan, "step_ms_predicted": math.nan, "predicted_tok_s": math.nan,
           "forward_ms_predicted": math.nan, "draft_ms_predicted": math.nan, "host_ms_predicted": math.nan}
    rates = _rates(g)
    draft = _draft_cost(g, numbers, drafter, draft_host_ms)
    total_steps = 0.0
    parts = [0.0, 0.0, 0.0]  # forward, drafting, host ms over every batch
    decoded = 0
    for i, lengths in enumerate(_batches(g, size)):
        sim = simulate_batch(rates, lengths, numbers["tau"], trials=TRIALS, seed=i)
        cost = batch_cost(profile, sim, numbers["width"], numbers["kv"], numbers["draft_ms_per_step"], host_ms,
                          draft)
        if cost is None:
            return nan
        total_steps, decoded = total_steps + sim.steps, decoded + sum(lengths)
        parts = [parts[0] + cost.forward_ms, parts[1] + cost.draft_ms, parts[2] + cost.host_ms]
    total_ms = sum(parts)
    if total_ms <= 0 or total_steps <= 0:
        return nan
    return {"steps_predicted": total_steps, "step_ms_predicted": total_ms / total_steps,
            "predicted_tok_s": decoded * 1000.0 / total_ms, "forward_ms_predicted": parts[0] / total_steps,
            "draft_ms_predicted": parts[1] / total_steps, "host_ms_predicted": parts[2] / total_steps}


def draft_priced(numbers: dict, drafter: LatencyProfile | None) -> str:
    """How a point's drafting is priced: on the drafter's curve, as the run measured it, or '' (no drafting)."""
    if drafter is not None and numbers.get("draft_forwards_per_step", 0.0) > 0:
        return "drafter curve"
    return "measured" if numbers.get("draft_ms_per_step", 0.0) > 0 else ""


def drafter_profile(run_dir: Path) -> LatencyProfile | None:
    """The drafter's L_d(B, w) measured on the spot after the run (DRAFT_COPY), None when the run folder has none."""
    path = Path(run_dir) / DRAFT_COPY
    return load_profile(path) if path.exists() else None


def grid_needs(records: pd.DataFrame) -> tuple[dict[int, list[float]], list[int]]:
    """({B: the mean verify widths of the points at B}, the KV lengths of the points, rounded to 32): what an
    on-the-spot profile of the grid measures (planning/spot_profile.grid_widths). A server's levels need none."""
    needs: dict[int, list[float]] = {}
    kvs: set[int] = set()
    r = _mode_rows(records)
    for (_, _, size), g in r.groupby(["dataset", "method", "batch_size"], sort=True):
        if (g.batching == "closed").any():
            continue
        numbers = _step_numbers(g, int(size))
        if not numbers or not math.isfinite(numbers["width"]):
            continue
        needs.setdefault(int(size), []).append(round(numbers["width"], 3))
        kvs.add(max(32, 32 * round(numbers["kv"] / 32)))
    return {b: sorted(set(w)) for b, w in needs.items()}, sorted(kvs)


def _setting(meta: dict, label: str, size: int) -> str:
    """What the label ran with at this batch size: tree size or gamma (run.yaml's chosen), '' when it chose none."""
    from .batchbest import choice_at

    said = choice_at(meta.get("chosen") or {}, label, size)
    if said:
        return said.split(" (")[0]
    tree = (meta.get("trees") or {}).get(label) or {}
    return f"tree size {tree['size']}" if tree.get("size") else ""


def _timing(summary: pd.DataFrame, dataset: str, label: str, size: int) -> str:
    if summary is None or summary.empty or "timing" not in summary:
        return ""
    s = summary[(summary.dataset == dataset) & (summary.method == label)
                & (pd.to_numeric(summary.batch_size, errors="coerce").fillna(1).astype(int) == size)]
    if size > 1 and "batching" in s:
        s = s[s.batching == "unpadded"] if (s.batching == "unpadded").any() else s
    return str(s.timing.iloc[0]).split(":")[0] if len(s) else ""


def table(records: pd.DataFrame, summary: pd.DataFrame | None, meta: dict,
          profile: LatencyProfile | None, drafter: LatencyProfile | None = None) -> pd.DataFrame:
    """COLUMNS, one row per dataset x method label x batch size (ar included). `drafter`: a drafter model's
    L_d(B, w) (drafter_profile), pricing the labels that draft with one (draft_forwards)."""
    rows = []
    r = _mode_rows(records)
    single = {key: g for key, g in r[r.batch_size == 1].groupby(["dataset", "method"])}  # batch 1's records
    host = {key: host_ms_per_row(g) for key, g in single.items()}
    draft_host = {key: draft_host_ms(g, _step_numbers(g, 1), drafter) for key, g in single.items()}
    for (dataset, label, size), g in r.groupby(["dataset", "method", "batch_size"], sort=True):
        numbers = _step_numbers(g, int(size))
        if not numbers:
            continue
        predicted = {"steps_predicted": math.nan, "step_ms_predicted": math.nan, "predicted_tok_s": math.nan}
        if profile is not None and math.isfinite(numbers["tau"]) and not (g.batching == "closed").any():
            predicted = predict(g, int(size), numbers, profile, host.get((dataset, label), 0.0), drafter,
                                draft_host.get((dataset, label), 0.0))
            predicted["draft_priced"] = draft_priced(numbers, drafter)
        tree = (meta.get("trees") or {}).get(label) or {}
        rows.append({"dataset": dataset, "batch_size": int(size), "method": label,
                     "setting": _setting(meta, label, int(size)),
                     "mode": "-" if size == 1 else str(g.batching.iloc[0]), **numbers,
                     "tau_file": tree.get("predicted_tau") if size == 1 else None,
                     "host_ms_per_row": host.get((dataset, label), 0.0),
                     "draft_host_ms": draft_host.get((dataset, label), 0.0), **predicted,
                     "timing": _timing(summary, dataset, label, int(size))})
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    out = pd.DataFrame(rows)
    out["error"] = out.predicted_tok_s / out.measured_tok_s - 1.0
    out["within_goal"] = out.error.abs() <= GOAL
    out["steps_error"] = out.steps_predicted / out.steps_measured - 1.0
    out["step_cost_error"] = out.step_ms_predicted / out.step_ms_measured - 1.0
    ar = out[out.method == "ar"].set_index(["dataset", "batch_size"])
    key = list(zip(out.dataset, out.batch_size))
    ar_measured = [ar.measured_tok_s.get(k, math.nan) for k in key]
    ar_predicted = [ar.predicted_tok_s.get(k, math.nan) for k in key]
    out["measured_speedup"] = out.measured_tok_s / ar_measured
    out["predicted_speedup"] = out.predicted_tok_s / ar_predicted
    out["break_even"], out["break_even_predicted"] = "", ""
    axis = "N" if (out["mode"] == "closed").any() else "B"  # a server's requests in flight, or a batch size
    for (dataset, label), g in out.groupby(["dataset", "method"]):
        if label == "ar":
            continue
        idx = g.index
        out.loc[idx, "break_even"] = break_even(list(zip(g.batch_size, g.measured_speedup)), axis).text
        out.loc[idx, "break_even_predicted"] = break_even(list(zip(g.batch_size, g.predicted_speedup)), axis).text
    out["best_at_batch"] = False
    family = out.method.str.split("@").str[0]
    for _, g in out.assign(family=family).groupby(["dataset", "family", "batch_size"]):
        if g.measured_tok_s.notna().any():
            out.loc[g.measured_tok_s.idxmax(), "best_at_batch"] = True
    return out.reindex(columns=COLUMNS).sort_values(["dataset", "method", "batch_size"], kind="stable").reset_index(
        drop=True)

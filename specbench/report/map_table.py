"""The map of a batch-size sweep (`specbench map`, or any run with two or more batch sizes): per dataset, method label
and batch size B, the measured decode throughput beside the cost model's prediction from L(B, w)
(planning/batch_prediction.py), the speedup over `ar` at the same B, per-user tokens/s, and the break-even batch
size where the method stops beating `ar`. Computed from records.csv, summary.csv, run.yaml and the latency profile
the run used (the copy in the run folder, else the file run.yaml names); never re-runs a model.

What the prediction takes from the run, per (label, B), averaged over its decode steps (the prefill is not a step):
  width   = sum (target_tokens - prompt_tokens) / sum (target_forwards - 1)   new tokens per sample per forward
  tau     = sum (new_tokens - 1) / sum (target_forwards - 1)                   tokens per sample per step
  draft   = drafting seconds / steps (a batch's drafting once per batch)
  kv      = mean prompt tokens + half the mean new tokens
so the comparison tests the cost model (the step's time from the profile), not the acceptance; `tau_file` gives
the acceptance file's tau where the run had one for the label (batch 1's tree), for the other half of the error.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..core import store
from ..core.profile_file import LatencyProfile, load_profile
from ..errors import SpecbenchError
from ..planning.batch_prediction import StepShape, break_even, predicted_tok_s

NUMERIC = ("target_forwards", "target_tokens", "prompt_tokens", "new_tokens", "draft_s", "latency_s", "wall_s",
           "ttft_s", "batch_wall_s", "prefill_s", "prefill_tokens", "tpot_ms")
PROFILE_COPY = "latency_profile.yaml"  # the profile `specbench map` predicted from, kept in the run folder

COLUMNS = ["dataset", "batch_size", "method", "setting", "mode", "width", "tau", "tau_file", "draft_ms_per_step",
           "kv", "predicted_tok_s", "measured_tok_s", "error", "per_user_tok_s", "predicted_speedup",
           "measured_speedup", "break_even", "break_even_predicted", "best_at_batch", "timing"]


def has_sweep(records: pd.DataFrame) -> bool:
    """Two or more batch sizes in the run: what a map is drawn from."""
    return "batch_size" in records and pd.to_numeric(records.batch_size, errors="coerce").nunique() >= 2


def run_profile(run_dir: Path, meta: dict) -> tuple[LatencyProfile | None, str]:
    """(the latency profile the run predicted from, where it came from) or (None, why none)."""
    if (meta.get("settings") or {}).get("engine") == "openai":
        return None, "a server's latency curve is not profiled here: measured only"
    copy = Path(run_dir) / PROFILE_COPY
    if copy.exists():
        return load_profile(copy), f"{PROFILE_COPY} (the run's copy)"
    for entry in (meta.get("data_files") or {}).get("used") or []:
        if entry.get("kind") == "profile" and entry.get("path"):
            path = Path(entry["path"]) if Path(entry["path"]).exists() else store.find(entry["path"])
            if path is not None and Path(path).exists():
                try:
                    return load_profile(path), str(entry["path"])
                except SpecbenchError:
                    continue
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
    if (g.batching == "closed").any():  # a server's level: each row's wall_s is its share of the level's time
        wall = float(num("wall_s").sum())
        out["measured_tok_s"] = float(num("new_tokens").sum()) / wall if wall > 0 else math.nan
        draft_s, drafted_steps = 0.0, 0.0
    elif size == 1:
        draft_s, drafted_steps = float(num("draft_s").sum()), n_steps
        decode_s = float((num("latency_s" if "latency_s" in g else "wall_s") - num("ttft_s")).sum())
        out["measured_tok_s"] = float((num("new_tokens") - 1).clip(lower=0).sum()) / decode_s if decode_s > 0 else math.nan
    else:  # drafting and wall time are per batch, repeated on each sample's row
        batches = g.groupby("batch_id", dropna=False)
        draft_s = float(batches.draft_s.first().fillna(0).sum())
        drafted_steps = float((batches.target_forwards.max() - 1).clip(lower=1).sum())
        decode_s = float((batches.batch_wall_s.first() - batches.prefill_s.first().fillna(0)).sum())
        decoded = float((num("new_tokens") - num("prefill_tokens")).sum())
        out["measured_tok_s"] = decoded / decode_s if decode_s > 0 else math.nan
    out["draft_ms_per_step"] = 1000.0 * draft_s / drafted_steps if drafted_steps else 0.0
    if not n_steps and not math.isfinite(out.get("measured_tok_s", math.nan)):
        return {}
    tpot = pd.to_numeric(g.get("tpot_ms"), errors="coerce")
    out["per_user_tok_s"] = float((1000.0 / tpot[tpot > 0]).mean()) if tpot is not None and (tpot > 0).any() \
        else math.nan
    return out


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
          profile: LatencyProfile | None) -> pd.DataFrame:
    """COLUMNS, one row per dataset x method label x batch size (ar included)."""
    rows = []
    r = _mode_rows(records)
    for (dataset, label, size), g in r.groupby(["dataset", "method", "batch_size"], sort=True):
        numbers = _step_numbers(g, int(size))
        if not numbers:
            continue
        predicted = None
        if profile is not None and math.isfinite(numbers["tau"]) and not (g.batching == "closed").any():
            predicted = predicted_tok_s(profile, StepShape(int(size), numbers["width"], numbers["tau"],
                                                           numbers["draft_ms_per_step"], numbers["kv"]))
        tree = (meta.get("trees") or {}).get(label) or {}
        rows.append({"dataset": dataset, "batch_size": int(size), "method": label,
                     "setting": _setting(meta, label, int(size)),
                     "mode": "-" if size == 1 else str(g.batching.iloc[0]), **numbers,
                     "tau_file": tree.get("predicted_tau") if size == 1 else None,
                     "predicted_tok_s": math.nan if predicted is None else predicted,
                     "timing": _timing(summary, dataset, label, int(size))})
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    out = pd.DataFrame(rows)
    out["error"] = out.predicted_tok_s / out.measured_tok_s - 1.0
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
    return out[COLUMNS].sort_values(["dataset", "method", "batch_size"], kind="stable").reset_index(drop=True)

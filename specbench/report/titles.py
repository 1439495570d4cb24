"""Titles of every plot of a run: the model, the hardware key, the dtype and the number of prompts it was measured on
(from run.yaml's `model` and `environment`, else from the records), so a PNG on its own says what it shows."""

from __future__ import annotations

import textwrap

import pandas as pd


def _title_parts(meta: dict, records: pd.DataFrame | None) -> dict[str, str]:
    """model, hardware, dtype and prompt count of a run, from run.yaml (model, environment), else the records."""
    model_meta, env = meta.get("model") or {}, meta.get("environment") or {}

    def from_records(column: str) -> str:
        if records is None or column not in records or records.empty:
            return ""
        return " / ".join(dict.fromkeys(str(v) for v in records[column] if str(v)))

    prompts = ""
    if records is not None and not records.empty and {"dataset", "prompt_id"} <= set(records):
        per = records.groupby("dataset", sort=False).prompt_id.nunique()
        total = int(per.sum())
        names = ", ".join(per.index) if len(per) == 1 else ", ".join(f"{d} {n}" for d, n in per.items())
        prompts = f"{total} prompt{'s' if total != 1 else ''} ({names})"
    # the hardware key (cpu-amd-epyc-avx512bf16-2c, nvidia-h200): the key profiles and trees are filed under, and
    # what says the ISA tier and cores a speedup depends on; a vendor name ("AMD EPYC 7B13") says neither
    device = str(env.get("hardware") or from_records("hardware") or env.get("device") or from_records("device")
                 or "device ?")
    placement = str(env.get("placement") or from_records("placement") or "")
    # a device map or tensor parallelism (core/model/placement.py)
    if placement and not placement.startswith("single:"):
        device += f" [{placement}]"
    return {"model": str(model_meta.get("name") or model_meta.get("spec") or from_records("model") or "model ?"),
            "device": device,
            "dtype": str(env.get("dtype") or from_records("dtype") or "dtype ?"),
            "prompts": prompts or "prompts ?"}


def plot_title(meta: dict, records: pd.DataFrame | None = None) -> str:
    """The title every plot of a run carries: '<model> on <hardware key>, <dtype>, <N> prompts (<datasets>)'; the
    device name stands in for runs from before the key was recorded."""
    p = _title_parts(meta, records)
    return f"{p['model']} on {p['device']}, {p['dtype']}, {p['prompts']}"


def comparison_title(runs: list[tuple[dict, pd.DataFrame]]) -> str:
    """plot_title for several runs (meta, records): a part shared by every run is said once, others joined by
    ' vs ' in run order."""
    parts = [_title_parts(meta, records) for meta, records in runs]
    said = {k: " vs ".join(dict.fromkeys(p[k] for p in parts)) for k in ("model", "device", "dtype", "prompts")}
    return f"{said['model']} on {said['device']}, {said['dtype']}, {said['prompts']}"


def set_title(ax, title: str, width_in: float) -> None:
    """The title in 9 pt, wrapped to the figure's width, preferably after a comma (never inside '6 prompts')."""
    if not title:
        return
    chunks, depth, start = [], 0, 0
    for i, ch in enumerate(title):  # split at ", " outside parentheses
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and title.startswith(", ", i):
            chunks.append(title[start:i])
            start = i + 2
    chunks.append(title[start:])
    width, lines = max(40, int(width_in * 13)), [""]
    for chunk in chunks:
        joined = f"{lines[-1]}, {chunk}" if lines[-1] else chunk
        if len(joined) <= width or not lines[-1]:
            lines[-1] = joined
        else:
            lines[-1] += ","
            lines.append(chunk)
    ax.set_title("\n".join(textwrap.fill(line, width) for line in lines), fontsize=9)


"""report.md's "Synthetic acceptance: measured vs plan" for a --synthetic-acceptance run: `plan`'s prediction
(planning/plan.py) for the same model shape, the same latency curve (the profile the run used) and the same stated
acceptance, at the run's tree size, beside each measured speedup, the error split into its tau part and its
step-cost part as the trees' section splits it (prediction_split.py):

    decode speedup / plan's speedup = (tau / plan's tau) x ((plan's step / plan's L(1)) / (step / ar's step))

The acceptance part is the stated rates against the drawn ones (sampling, and plan's tree against the run's); the
step-cost part is plan's pricing (the verify forward from the curve, the drafting from the drafter's share of the
model's weights) against the steps the run timed. Plan's files (plan.yaml, its trees) go to the run folder's plan/.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd

from ..core import store
from ..errors import SpecbenchError
from . import prediction_split
from .markdown import markdown_table

TITLE = "## Synthetic acceptance: measured vs plan"


def _profile_path(meta: dict) -> Path | None:
    """The latency profile the run read (run.yaml's data_files), None when it had none."""
    for entry in (meta.get("data_files") or {}).get("used") or []:
        if entry.get("kind") == "profile" and entry.get("path"):
            path = Path(entry["path"]) if Path(entry["path"]).exists() else store.find(entry["path"])
            if path is not None and Path(path).is_file():
                return Path(path)
    return None


def _acceptance_folder(given: str, methods: list[str], folder: Path) -> Path:
    """A folder of <method> acceptance files for plan: the given folder itself, else the one file (or the rates, as a
    speculation_profile.json) copied once per method."""
    if Path(given).is_dir():
        return Path(given)
    from ..core.acceptance_profile import read, speculation_profile, write_speculation_profile

    folder.mkdir(parents=True, exist_ok=True)
    for method in methods:
        if Path(given).is_file():
            suffix = ".json" if given.endswith(".json") else ".yaml"
            shutil.copyfile(given, folder / f"{method}{suffix}")
        else:
            payload = speculation_profile(read(given).conditional, method, "stated rates", measured=False)
            write_speculation_profile(payload, folder / f"{method}.json")
    return folder


def _kv(records: pd.DataFrame) -> int:
    """The run's mean KV length over a turn: prompt tokens + half the new tokens (the KV length plan reads)."""
    prompt = pd.to_numeric(records.get("prompt_tokens"), errors="coerce").mean()
    new = pd.to_numeric(records.get("new_tokens"), errors="coerce").mean()
    return max(1, int(round(prompt + new / 2))) if math.isfinite(prompt) and math.isfinite(new) else 512


def section(run_dir: Path, summary: pd.DataFrame, records: pd.DataFrame, meta: dict) -> list[str]:
    """The section's lines ([] for a run without synthetic acceptance or without a method plan covers)."""
    block = meta.get("synthetic_acceptance")
    if not block or summary.empty:
        return []
    from ..planning.plan import PlanRequest, chain_methods, plan, tree_methods

    settings = meta.get("settings") or {}
    covered = set(tree_methods()) | set(chain_methods())
    methods = [m for m in settings.get("methods") or [] if m in covered]
    if not methods:
        return []
    model, dtype = settings.get("model"), (meta.get("environment") or {}).get("dtype") or settings.get("dtype")
    md = [TITLE, ""]
    profile = _profile_path(meta)
    if profile is None:
        return md + [f"No prediction beside the measurement: the run read no latency profile of {model} in {dtype} "
                     "on this hardware. Take one, then run again (plan prices the same curve and the same stated "
                     f"acceptance): `specbench profile --model {model} --dtype {dtype} --widths 1,2,4,8,16,32,64 "
                     "--kv-length 512 --repeats 3`.", ""]
    trees = meta.get("trees") or {}
    sizes = {m: (trees.get(m) or {}).get("size") for m in methods if (trees.get(m) or {}).get("size")}
    try:
        folder = _acceptance_folder(str(block.get("given")), methods, Path(run_dir) / "plan" / "acceptance")
        result = plan(PlanRequest(model=model, gpu=str(profile), dtype=dtype, acceptance=str(folder),
                                  methods=tuple(methods), kv_length=_kv(records), context=2 * _kv(records),
                                  out=Path(run_dir) / "plan", sizes=sizes,
                                  max_size=max([16, *sizes.values()])))  # the run's sizes: no wider search
    except (SpecbenchError, OSError) as exc:
        return md + [f"No prediction beside the measurement: plan could not price this run ({exc}).", ""]
    ar_ms = prediction_split.ar_steps(summary)
    one = summary[summary.batch_size == 1] if "batch_size" in summary else summary
    rows = []
    for p in result.rows:
        for _, r in one[one.method == p.method].iterrows():
            info = {"predicted_tau": p.tau, "predicted_speedup": p.speedup, "predicted_step_ms": p.step_ms,
                    "ar_step_ms": p.ar_ms}
            split = prediction_split.split(r.to_dict(), info, ar_ms.get(r.dataset))
            error = split["decode_speedup"] / p.speedup - 1 if p.speedup else math.nan
            rows.append({"method": p.method, "dataset": r.dataset,
                         "tree (run)": (trees.get(p.method) or {}).get("size"), "tree (plan)": p.size,
                         "speedup": round(float(r.speedup), 3),
                         "decode speedup": split["decode_speedup"], "plan speedup": p.speedup,
                         "error": f"{error:+.0%}" if math.isfinite(error) else "-",
                         "tau": split["decode_tau"], "plan tau": p.tau, "tau part": split["tau_part"],
                         "step ms": split["step_ms"], "plan step ms": p.step_ms, "cost part": split["cost_part"],
                         "misses": split["misses"], "paper": _paper(p.paper), "why not": p.why_not or ""})
    if not rows:
        return []
    frame = pd.DataFrame(rows)
    frame.to_csv(Path(run_dir) / "synthetic_prediction.csv", index=False)
    md += [markdown_table(frame.drop(columns=["why not"]) if not frame["why not"].any() else frame), "",
           f"`plan speedup`: `specbench plan --model {model} --gpu {store.relative_to_cwd(profile)} --dtype {dtype} "
           f"--acceptance <the stated acceptance>` at the run's tree size and KV length {_kv(records)} (its files in "
           "plan/); `decode speedup`: the measured speedup of the decode steps alone (the prediction's kind, the "
           "prefill is not a step); `error`: decode speedup over plan's; `tau part` x `cost part` = decode speedup / "
           "plan speedup: `tau part` = measured decode tau / plan's tau, `cost part` = plan's step in L(1)s / the "
           "measured step in ar's steps (a part misses when it is more than "
           f"{prediction_split.GOAL:.0%} from 1); `paper`: the speedup the acceptance file's paper measured, on "
           "its hardware.", ""]
    md += [f"Plan: {note}." for note in result.notes] + ([""] if result.notes else [])
    return md


def _paper(measured: dict) -> str:
    speedup = measured.get("speedup")
    return f"{speedup:.2f}x ({measured.get('gpu', '?')})" if isinstance(speedup, (int, float)) else "-"

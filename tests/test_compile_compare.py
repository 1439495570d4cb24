"""benchmarks/compile_compare.py, the GPU pass's CUDA-graphs check run on the CPU: eager and compiled run folders
side by side, which methods ran fully compiled per batch size, and the `ar` goal's exit code (gpu_pass.sh's
graphs-goal step asks compiled ar >= 3x eager ar)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "compile_compare.py"


def _run_folder(path: Path, rates: dict, forwards: dict | None = None) -> Path:
    path.mkdir(parents=True)
    rows = []
    for (method, batch), tok_s in rates.items():
        row = {"method": method, "dataset": "gsm8k", "batch_size": batch, "tokens_per_s": tok_s, "speedup": 1.0,
               "timing": "ok", "of_roofline": 0.5, "host_overhead": 0.1}
        if forwards is not None:
            row["compiled_forwards"], row["eager_forwards"] = forwards[(method, batch)]
        rows.append(row)
    pd.DataFrame(rows).to_csv(path / "summary.csv", index=False)
    (path / "tokens.jsonl").write_text("".join(
        json.dumps({"method": m, "dataset": "gsm8k", "prompt_id": 0, "turn": 0, "batch_size": b, "tokens": [1, 2]})
        + "\n" for m, b in rates))
    (path / "run.yaml").write_text(yaml.safe_dump({"compile": {"target": {"shapes": [{"width": 1}], "seconds": 3.0,
                                                                          "buckets": [1], "capacity": 256}}}))
    return path


def _compare(tmp_path, compiled_ar: float):
    eager = _run_folder(tmp_path / "eager", {("ar", 1): 10.0, ("sd", 1): 12.0})
    compiled = _run_folder(tmp_path / "compiled", {("ar", 1): compiled_ar, ("sd", 1): 40.0, ("sd", 4): 90.0},
                           {("ar", 1): (50, 0), ("sd", 1): (80, 0), ("sd", 4): (30, 2)})
    return subprocess.run([sys.executable, str(SCRIPT), str(eager), str(compiled), "--goal-ar", "3"],
                          capture_output=True, text=True)


def test_ar_goal_met_and_fully_compiled_rows(tmp_path):
    done = _compare(tmp_path, 35.0)
    assert done.returncode == 0, done.stderr
    assert "gsm8k 3.50x (goal 3.0x: met)" in done.stdout
    lines = [line.split() for line in done.stdout.splitlines()]
    assert ["sd", "4", "30", "2", "False"] in lines and ["sd", "1", "80", "0", "True"] in lines


def test_ar_goal_missed_exits_non_zero(tmp_path):
    done = _compare(tmp_path, 20.0)
    assert done.returncode == 1 and "goal 3.0x: NOT met" in done.stdout

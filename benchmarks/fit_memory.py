"""The fit check's estimate against the measured peak memory of the command it was made for (issue 43).

    python benchmarks/fit_memory.py qwen2.5-0.5b qwen2.5-1.5b configs/qwen2.5-3b.json ... [--dtype bfloat16]

For each random-weight model: the estimate memory_need.need makes for `specbench profile --widths W --kv-length K
--repeats R` (weights in the dtype, KV, activations of the widest forward, working memory), then that profile run in
its own process, its peak RSS read by /usr/bin/time (maxrss of that process alone). Prints one markdown row per
model: parameters, dtype, estimate, measured peak, measured / estimate. A NAME.json argument is a config.json
(random:PATH); the rest are presets.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

WIDTHS, KV, REPEATS = [1, 8, 32], [512], 2


def estimate(spec: str, dtype: str):
    import torch

    from specbench.core.model.load import model_config
    from specbench.core.model.memory_need import need, profile_workload

    config = model_config(spec)
    return need(spec, config, getattr(torch, dtype), torch.device("cpu"), profile_workload(WIDTHS, KV, REPEATS, [1]))


def measured_peak_mb(spec: str, dtype: str) -> tuple[float, str]:
    """(peak RSS of `specbench profile` in MiB, the command's last output line)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["/usr/bin/time", "-f", "MAXRSS %M", str(Path(__file__).resolve().parent.parent / ".venv/bin/specbench"),
               "profile", "--model", spec, "--dtype", dtype, "--widths", ",".join(map(str, WIDTHS)),
               "--kv-length", ",".join(map(str, KV)), "--repeats", str(REPEATS), "--out", f"{tmp}/p.yaml"]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
    text = out.stdout + out.stderr
    rss = [line for line in text.splitlines() if line.startswith("MAXRSS")]
    if out.returncode != 0 or not rss:
        return float("nan"), text.strip().splitlines()[-1] if text.strip() else "no output"
    return int(rss[0].split()[1]) / 1024, ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    print("| model | parameters | dtype | estimate (GiB) | of which weights / KV / activations / working / slack | "
          "measured peak RSS (GiB) | measured / estimate |")
    print("|---|---:|---|---:|---|---:|---:|")
    for name in args.models:
        spec = f"random:{name}"
        found = estimate(spec, args.dtype)
        peak, why = measured_peak_mb(spec, args.dtype)
        parts = " / ".join(f"{found.parts.get(k, 0) / 2**30:.2f}"
                           for k in ("weights", "KV cache", "activations", "working memory", "slack"))
        label = Path(name).stem if name.endswith(".json") else name
        print(f"| {label} | {found.params / 1e9:.2f}B | {args.dtype} | {found.total / 2**30:.2f} | {parts} | "
              f"{peak / 1024:.2f} | {peak * 2**20 / found.total:.2f} |" + (f" {why}" if why else ""), flush=True)


if __name__ == "__main__":
    main()

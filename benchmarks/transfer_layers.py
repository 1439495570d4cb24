"""Which transfer layers to use (Hidden Transfer, Figures 5-6), measured on this model: train a projection for
transfer step 1 at each candidate layer (short runs, the same data and loss as `specbench train hidden-transfer`)
and score its top-1 / top-5 accuracy on held-out replies; then, with step 1 at the chosen layer, the same for
step 2 over the layers above it. Writes a CSV and a PNG per step.

    python benchmarks/transfer_layers.py --steps 120 --out benchmarks/results/transfer-layers
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from specbench.core.models import load_model
from specbench.data import datasets as ds
from specbench.drafters import transfer_projections as tp
from specbench.drafters.selfdistill import greedy_continuations, render, training_sequences
from specbench.drafters.train_medusa import TRAINING_MIX
from specbench.drafters.train_transfer import make_step_loss
from specbench.drafters.trainloop import optimise
from specbench.hwtrees.head_accuracy import transfer_ranks


def accuracy(target, proj, refs) -> list[tuple[float, float]]:
    """Per step: (top-1, top-5) accuracy over every reply position of the held-out references."""
    ranks = torch.cat([transfer_ranks(target, proj, ids, start) for ids, start in refs])  # [P, k]
    out = []
    for j in range(proj.steps):
        col = ranks[:, j][ranks[:, j] >= 0]
        out.append((float((col < 1).float().mean()), float((col < 5).float().mean())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--first", default="4,8,12,16,20,24,28", help="candidate layers for step 1")
    ap.add_argument("--second-gaps", default="2,5,8,11", help="step-2 layers: the chosen step-1 layer + these")
    ap.add_argument("--eval", default="gsm8k,mt-bench", help="held-out prompts")
    ap.add_argument("--limit", type=int, default=10, help="first N prompts of each --eval set")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/transfer-layers"))
    args = ap.parse_args()
    target = load_model(args.model, "float32", "cpu")
    target.model.requires_grad_(False)
    seqs = training_sequences(target, TRAINING_MIX, 100, 120, 96, None, min_reply=4)
    refs = []
    for name in args.eval.split(","):
        rendered = [render(target, p) for p in ds.load_prompts(name, args.limit)[1]]
        for ids, cont in zip(rendered, greedy_continuations(target, rendered, 64, label=f"references {name}")):
            refs.append((ids + cont, len(ids) - 1))
    args.out.mkdir(parents=True, exist_ok=True)
    hidden, layers = target.model.config.hidden_size, target.model.config.num_hidden_layers

    def trial(chosen: list[int]) -> tuple[list[tuple[float, float]], float]:
        proj = tp.TransferProjections(hidden, chosen)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as scratch:  # the loop's checkpoint is not kept
            optimise(proj, make_step_loss(target, proj, seqs, 32), steps=args.steps, lr=1e-3, save_every=10 ** 9,
                     ckpt_path=Path(scratch) / "state.pt", settings={}, resume=False, label=f"layers {chosen}")
        proj.requires_grad_(False)
        return accuracy(target, proj, refs), time.perf_counter() - t0

    rows = []
    for l1 in [int(x) for x in args.first.split(",") if 1 <= int(x) < layers]:
        acc, secs = trial([l1])
        rows.append({"step": 1, "layers": str(l1), "layer": l1, "top1": round(acc[0][0], 4),
                     "top5": round(acc[0][1], 4), "train_s": round(secs, 1)})
        print(rows[-1], flush=True)
    first = [r for r in rows if r["step"] == 1]
    best = max(r["top1"] for r in first)
    # the paper's rule: the highest layer whose accuracy is still within 1 point of the best (cheapest of the good)
    l1 = max(r["layer"] for r in first if r["top1"] >= best - 0.01)
    for gap in [int(x) for x in args.second_gaps.split(",")]:
        l2 = l1 + gap
        if l2 >= layers:
            continue
        acc, secs = trial([l1, l2])
        rows.append({"step": 2, "layers": f"{l1},{l2}", "layer": l2, "top1": round(acc[1][0], 4),
                     "top5": round(acc[1][1], 4), "train_s": round(secs, 1)})
        print(rows[-1], flush=True)
    import pandas as pd

    frame = pd.DataFrame(rows)
    frame.to_csv(args.out / "transfer_layers.csv", index=False)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, step in zip(axes, (1, 2)):
        part = frame[frame.step == step]
        for col in ("top1", "top5"):
            ax.plot(part.layer, part[col], marker="o", label=col)
        ax.set_xlabel(f"transfer layer of step {step}" + (f" (step 1 at {l1})" if step == 2 else ""))
        ax.set_ylabel(f"accuracy of step {step} (token +{step + 1})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{args.model}: accuracy per transfer layer ({args.steps} training steps each)", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out / "transfer_layers.png", dpi=110)
    print(frame.to_string(index=False))


if __name__ == "__main__":
    main()

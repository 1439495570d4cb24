"""Which transfer layers to use (Hidden Transfer, Figures 5-6), measured on this model: train a projection for
transfer step 1 at each candidate layer (short runs, the same data and loss as `specbench train hidden-transfer`)
and score its top-1 / top-5 accuracy on held-out replies; then, with step 1 at the chosen layer, the same for
step 2 over the layers above it, and so on for step 3. Writes a CSV and a PNG per step.

The greedy per-step choice is a proposal, not a verdict: a high step-1 layer leaves the later steps few layers to
refine their pseudo states. On smollm2-135m it proposed 22, 24, 28, which trained at full length lost to 12, 17, 22
at every position after the first and in tau end to end (RESULTS-cpu.md). Confirm a proposal head to head:
    specbench train hidden-transfer --transfer-layers A,B,C --out /tmp/proposal
    python benchmarks/accuracy_comparison.py --hidden-transfer artifacts/<model>/hidden-transfer \
        --hidden-transfer /tmp/proposal

    python benchmarks/transfer_layers.py --steps 120 --out benchmarks/results/transfer-layers
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from specbench.core.model.load import load_model
from specbench.data import datasets as ds
from specbench.methods.hidden_transfer import artifact as tp
from specbench.train.selfdistill import greedy_continuations, render, training_sequences
from specbench.train.settings import TRAINING_MIX
from specbench.methods.hidden_transfer.training import make_update_loss
from specbench.train.optimiser import optimise
from specbench.methods.hidden_transfer.scoring import transfer_ranks


def accuracy(target, proj, refs) -> list[tuple[float, float]]:
    """Per transfer: (top-1, top-5) accuracy over every reply position of the held-out references."""
    ranks = torch.cat([transfer_ranks(target, proj, ids, start) for ids, start in refs])  # [P, k]
    out = []
    for j in range(proj.depth):
        col = ranks[:, j][ranks[:, j] >= 0]
        out.append((float((col < 1).float().mean()), float((col < 5).float().mean())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--first", default="4,8,12,16,20,24,28", help="candidate layers for step 1")
    ap.add_argument("--second-gaps", default="2,5,8,11",
                    help="later steps' candidate layers: the previous step's chosen layer + these")
    ap.add_argument("--transfer-steps", type=int, default=3, help="how many transfer steps to choose layers for")
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
            optimise(proj, make_update_loss(target, proj, seqs, 32), steps=args.steps, lr=1e-3, save_every=10 ** 9,
                     ckpt_path=Path(scratch) / "state.pt", settings={}, resume=False, label=f"layers {chosen}")
        proj.requires_grad_(False)
        return accuracy(target, proj, refs), time.perf_counter() - t0

    rows = []

    def choose(step: int) -> int:
        """The paper's rule: the highest layer whose top-1 is within 1 point of the step's best (cheapest of the
        good ones; for later steps, the layer furthest up keeps the fewest layers to run the pseudo states through)."""
        part = [r for r in rows if r["step"] == step]
        best = max(r["top1"] for r in part)
        return max(r["layer"] for r in part if r["top1"] >= best - 0.01)

    chosen: list[int] = []
    for step in range(1, args.transfer_steps + 1):
        if step == 1:
            candidates = [int(x) for x in args.first.split(",")]
        else:
            candidates = [chosen[-1] + int(g) for g in args.second_gaps.split(",")]
        candidates = [c for c in candidates if 1 <= c < layers]
        if not candidates:
            break
        for layer in candidates:
            acc, secs = trial(chosen + [layer])
            rows.append({"step": step, "layers": ",".join(map(str, chosen + [layer])), "layer": layer,
                         "top1": round(acc[step - 1][0], 4), "top5": round(acc[step - 1][1], 4),
                         "train_s": round(secs, 1)})
            print(rows[-1], flush=True)
        chosen.append(choose(step))
    print(f"chosen transfer layers: {','.join(map(str, chosen))}", flush=True)
    import pandas as pd

    frame = pd.DataFrame(rows)
    frame.to_csv(args.out / "transfer_layers.csv", index=False)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(frame.step.unique())
    fig, axes = plt.subplots(1, len(steps), figsize=(4.5 * len(steps), 3.5), squeeze=False)
    for ax, step in zip(axes[0], steps):
        part = frame[frame.step == step]
        for col in ("top1", "top5"):
            ax.plot(part.layer, part[col], marker="o", label=col)
        below = f" (steps below at {','.join(map(str, chosen[:step - 1]))})" if step > 1 else ""
        ax.set_xlabel(f"transfer layer of step {step}{below}")
        ax.set_ylabel(f"accuracy of step {step} (token +{step + 1})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{args.model}: accuracy per transfer layer ({args.steps} training steps each)", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out / "transfer_layers.png", dpi=110)
    print(frame.to_string(index=False))


if __name__ == "__main__":
    main()

"""Hidden Transfer's Figure 3 for this model: top-1 / top-5 accuracy of the guess for each future position, for
early exit (heads on a middle layer), Medusa heads, Hidden Transfer and PPD's prompt tokens, scored on the same
held-out prompts against the model's own greedy replies (every reply position is a split point).

Position N follows the paper: N = 2 is the first draft token (the token after the model's own next token).

    python benchmarks/accuracy_comparison.py --data gsm8k,mt-bench --limit 10 \\
        --early-exit artifacts/smollm2-135m/early-exit-l17 --out benchmarks/results/figure3
    (--hidden-transfer FOLDER, repeatable, compares projection sets, e.g. trained at other transfer layers)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specbench.core.model.load import load_model
from specbench.data import datasets as ds
from specbench.methods.medusa import artifact as mh
from specbench.methods.ppd import artifact as pt
from specbench.methods.hidden_transfer import artifact as tp
from specbench.train.selfdistill import greedy_continuations, render
from specbench.methods.ppd.scoring import score_sequence
from specbench.methods.hidden_transfer.scoring import transfer_ranks
from specbench.methods.medusa.scoring import medusa_ranks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default="gsm8k,mt-bench,humaneval", help="prompt sets (comma-separated)")
    ap.add_argument("--limit", type=int, default=10, help="first N prompts of each")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--early-exit", action="append", default=[], help="early-exit heads folder (repeatable)")
    ap.add_argument("--hidden-transfer", action="append", default=[],
                    help="projections folder (repeatable; default: the shipped projections)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/figure3"))
    args = ap.parse_args()
    target = load_model(args.model, "float32", "cpu")
    scorers = {}
    for folder in args.early_exit:
        heads = mh.load(folder, target).heads
        scorers[f"early exit (layer {heads.layer})"] = lambda ids, s, h=heads: medusa_ranks(target, h, ids, s)
    medusa = mh.resolve(None, target).heads
    scorers["Medusa heads"] = lambda ids, s: medusa_ranks(target, medusa, ids, s)
    for folder in args.hidden_transfer or [None]:
        art = tp.resolve(folder, target)
        proj, source = art.projections, f", {art.source}" if len(args.hidden_transfer) > 1 else ""
        label = f"Hidden Transfer (layers {proj.layers}{', Masked' if proj.masked else ''}{source})"
        scorers[label] = lambda ids, s, p=proj: transfer_ranks(target, p, ids, s)
    tokens = pt.resolve(None, target)
    scorers["PPD prompt tokens"] = lambda ids, s: score_sequence(target, tokens, ids, s)
    refs = []
    for name in args.data.split(","):
        rendered = [render(target, p) for p in ds.load_prompts(name, args.limit)[1]]
        conts = greedy_continuations(target, rendered, args.new_tokens, label=f"references {name}")
        refs += [(ids + c, len(ids) - 1) for ids, c in zip(rendered, conts) if len(c) >= 3]
    rows = []
    for method, score in scorers.items():
        ranks = torch.cat([score(ids, s) for ids, s in refs])  # [P, D]
        for d in range(ranks.shape[1]):
            col = ranks[:, d][ranks[:, d] >= 0]
            rows.append({"method": method, "N": d + 2, "top1": round(float((col < 1).float().mean()), 4),
                         "top5": round(float((col < 5).float().mean()), 4), "positions": int(col.numel())})
        print(rows[-ranks.shape[1]:], flush=True)
    import pandas as pd

    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "accuracy.csv", index=False)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    methods = list(dict.fromkeys(frame.method))
    for ax, col in zip(axes, ("top1", "top5")):
        width = 0.8 / len(methods)
        for i, m in enumerate(methods):
            part = frame[frame.method == m]
            ax.bar(part.N + (i - (len(methods) - 1) / 2) * width, part[col], width, label=m)
        ax.set_xlabel("N (N = 2: the first draft token)")
        ax.set_ylabel(f"{col} accuracy")
        ax.set_xticks(sorted(frame.N.unique()))
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{args.model}: guess accuracy per future position ({args.data}, first {args.limit} each, "
                 f"{len(refs)} replies)", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out / "accuracy.png", dpi=110)
    print(frame.pivot(index="method", columns="N", values=["top1", "top5"]).to_string())


if __name__ == "__main__":
    main()

"""Benchmark: where a decode step's time goes, per method at batch 1 (issue 44 §2).

Per method, over N prompts decoded greedily: wall time per step split into the target's forward (its decoder and
LM head, wherever called outside drafting), the drafter's forward (the drafter model, Medusa's heads, a feature
drafter's fuse/run/logits), and host overhead (the rest: masks, tree building, top-k, gathers, `.tolist()` syncs,
acceptance, cache compaction). `drafting` is the wall of the drafting call as the step runs it (the drafter's
forward plus the drafting's own host work), what a run's draft_s holds.

The timings come from wrapping the modules' calls on this process's instances (perf_counter; on a GPU each wrapped
call synchronises first, which itself slows the step a little). Nothing in the package is changed.

    python benchmarks/host_overhead.py [--model smollm2-135m] [--dataset gsm8k] [--limit 3] [--max-new-tokens 96]
        [--methods ar,pld,sd,ppd,medusa,hidden-transfer,eagle,parallelspec] [--tree T] [--threads N]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from specbench.core.model.load import dtype_name, load_model
from specbench.core.verify import Sampling
from specbench.data.datasets import load_prompts
from specbench.methods import get_method
from specbench.train.selfdistill import render

METHODS = "ar,pld,sd,ppd,medusa,hidden-transfer,eagle,parallelspec"


class Clock:
    """Seconds per category; only the outermost timed call counts (an LM head inside a drafter's logits is the
    drafter's), and calls into the target's modules inside drafting count as drafting."""

    def __init__(self, device):
        self.device = device
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.depth = 0
        self.drafting = False

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def wrap(self, obj, attr: str, category: str) -> None:
        inner = getattr(obj, attr)

        def timed(*args, **kwargs):
            if self.depth:
                self.depth += 1
                try:
                    return inner(*args, **kwargs)
                finally:
                    self.depth -= 1
            self.sync()
            start = time.perf_counter()
            self.depth = 1
            try:
                return inner(*args, **kwargs)
            finally:
                self.depth = 0
                self.sync()
                cat = "drafter" if self.drafting and category == "target" else category
                self.seconds[cat] += time.perf_counter() - start
                self.calls[cat] += 1

        setattr(obj, attr, timed)

    def region(self, obj, attr: str) -> None:
        """`obj.attr` is the step's drafting call: its wall is `drafting`; target modules inside it are drafting."""
        inner = getattr(obj, attr)

        def timed(*args, **kwargs):
            self.sync()
            start, self.drafting = time.perf_counter(), True
            try:
                return inner(*args, **kwargs)
            finally:
                self.drafting = False
                self.sync()
                self.seconds["drafting"] += time.perf_counter() - start

        setattr(obj, attr, timed)


def instrument(method, clock: Clock) -> None:
    """Wrap the target's modules, the method's drafter modules and its drafting call on these instances."""
    model = method.target.model
    clock.wrap(model, "forward", "target")
    clock.wrap(model.get_decoder(), "forward", "target")
    clock.wrap(model.get_output_embeddings(), "forward", "target")
    guesser = getattr(method, "guesser", None)
    if guesser is None:  # a chain method: its propose() drafts
        clock.region(method, "propose")
        if method.drafter is not None:
            drafter = method.drafter.model
            clock.wrap(drafter, "forward", "drafter")
            if hasattr(drafter, "get_decoder"):  # a transformers model (a trained drafter has its own layers)
                clock.wrap(drafter.get_decoder(), "forward", "drafter")
        return
    clock.region(method.proposer, "propose")
    if hasattr(guesser, "heads"):  # medusa: the heads on the accepted node's state, after verification
        clock.wrap(guesser.heads.heads, "logits", "drafter")
    art = getattr(guesser, "art", None)
    if art is not None:  # a feature drafter (eagle, parallelspec)
        for name in ("fuse", "run", "features", "logits", "head_logits", "top_ids"):
            clock.wrap(art.drafter, name, "drafter")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dataset", default="gsm8k")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--methods", default=METHODS, help=f"comma-separated (default {METHODS})")
    parser.add_argument("--tree", default=None, help="--tree for the tree methods (default: each method's own)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    target = load_model(args.model, args.dtype, args.device)
    _, prompts = load_prompts(args.dataset, args.limit)
    ids = [torch.tensor([render(target, p)], device=target.device) for p in prompts]
    print(f"model {target.name}, {dtype_name(target.dtype)}, {len(ids)} {args.dataset} prompts, "
          f"{args.max_new_tokens} new tokens max, threads {torch.get_num_threads()}, batch 1, greedy")
    head = (f"{'method':>16} {'tok/s':>6} {'steps':>5} {'tok/step':>8} | ms per step: {'wall':>6} {'target':>6} "
            f"{'drafter':>7} {'drafting':>8} {'host':>6} {'host %':>6}")
    print(head)
    for name in args.methods.split(","):
        cls = get_method(name)
        options = {"tree": args.tree} if args.tree and cls.kind == "tree" else {}
        method = cls(target, options)
        method.generate(ids[0][:, :32], 8, Sampling(), None)  # warm-up, untimed
        clock = Clock(target.device)
        instrument(method, clock)
        wall, tokens, steps = 0.0, 0, 0
        for x in ids:
            clock.sync()
            start = time.perf_counter()
            gen = method.generate(x, args.max_new_tokens, Sampling(), None)
            clock.sync()
            wall += time.perf_counter() - start
            tokens += len(gen.tokens)
            steps += len(gen.accepted_lengths)  # target forwards that emitted tokens (the prefill's included)
        s = clock.seconds
        host = wall - s["target"] - s["drafter"]
        per = 1e3 / steps
        print(f"{name:>16} {tokens / wall:6.1f} {steps:5d} {tokens / steps:8.2f} | {'':13}{wall * per:6.2f} "
              f"{s['target'] * per:6.2f} {s['drafter'] * per:7.2f} {s['drafting'] * per:8.2f} {host * per:6.2f} "
              f"{100 * host / wall:5.1f}%", flush=True)


if __name__ == "__main__":
    main()

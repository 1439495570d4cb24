"""Benchmark: self-distillation throughput of the unpadded batch engine with refill (greedy.ragged_greedy, what
`specbench train ...` uses) against the former route, transformers' generate on left-padded groups
(greedy.padded_greedy), on the same prompts of the training mix, back to back in one process. Prints seconds, new
tokens per second, sequences per second, whether the tokens agree, and the load average (the machine is shared).

    python benchmarks/selfdistill_throughput.py [--prompts 64] [--new-tokens 96] [--slots 32] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import os

import torch

from specbench.core.model.load import load_model
from specbench.core.machine.timing import now, since
from specbench.train.settings import TRAINING_MIX
from specbench.train.greedy import padded_greedy, ragged_greedy
from specbench.train.selfdistill import load_source, render, source_names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data", default=TRAINING_MIX)
    parser.add_argument("--prompts", type=int, default=64, help="prompts in all, shared out over the sources")
    parser.add_argument("--first", type=int, default=100, help="first prompt of each source (after the held-out)")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--order", default="padded,ragged", help="engines, in the order they run")
    args = parser.parse_args()
    target = load_model(args.model, "float32", "cpu")
    names = source_names(args.data)
    each = -(-args.prompts // len(names))
    prompts = [render(target, p) for name in names
               for p in load_source(name, args.first + each)[args.first:]][:args.prompts]
    engines = {"padded": padded_greedy, "ragged": ragged_greedy}
    results = {}
    print(f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens "
          f"(mean {sum(map(len, prompts)) / len(prompts):.0f}), up to {args.new_tokens} new tokens, "
          f"{args.slots} slots, {torch.get_num_threads()} threads")
    for name in args.order.split(","):
        load = os.getloadavg()
        t0 = now()
        out = engines[name](target.model, prompts, args.new_tokens, target.tokenizer.stop_ids, args.slots,
                            label=name)
        seconds = since(t0)
        tokens = sum(map(len, out))
        results[name] = out
        print(f"{name:>6}: {seconds:7.1f} s, {tokens} new tokens, {tokens / seconds:6.1f} tok/s, "
              f"{len(out) / seconds:5.2f} seq/s; load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
              f"after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if len(results) == 2:
        a, b = results.values()
        same = sum(x == y for x, y in zip(a, b))
        print(f"identical continuations: {same}/{len(a)}")


if __name__ == "__main__":
    main()

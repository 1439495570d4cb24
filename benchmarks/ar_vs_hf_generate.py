"""Benchmark: specbench's `ar` loop vs Hugging Face `generate` (greedy), same prompts, interleaved.

Checks that the baseline every speedup is measured against is a fair one: tokens/s within 10% of `generate`
and identical greedy tokens.

    python benchmarks/ar_vs_hf_generate.py [--model smollm2-135m] [--dataset humaneval] [--limit 10] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
import time

import torch

from specbench.core.model.load import dtype_name, load_model
from specbench.core.verify import Sampling
from specbench.data.datasets import load_prompts
from specbench.methods import get_method
from specbench.train.selfdistill import render


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:<i>")
    args = parser.parse_args()

    target = load_model(args.model, args.dtype, args.device)
    ar = get_method("ar")(target)
    _, prompts = load_prompts(args.dataset, args.limit)
    stop = list(target.tokenizer.stop_ids)

    def hf_generate(ids, n):
        out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                    eos_token_id=stop, pad_token_id=stop[0])
        return out[0, ids.shape[1]:].tolist()

    first = torch.tensor([render(target, prompts[0])], device=target.device)
    ar.generate(first, 16, Sampling(), None)  # warm-up, untimed
    hf_generate(first, 16)

    totals = {"ar": [0, 0.0], "generate": [0, 0.0]}
    equal = 0
    print(f"{'prompt':>14} {'ar tok/s':>9} {'generate tok/s':>15} {'same tokens':>12}")
    def timed(fn, ids):
        start = time.perf_counter()
        tokens = fn(ids)
        return tokens, time.perf_counter() - start

    run_ar = lambda ids: ar.generate(ids, args.max_new_tokens, Sampling(), None).tokens  # noqa: E731
    run_hf = lambda ids: hf_generate(ids, args.max_new_tokens)  # noqa: E731
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([render(target, prompt)], device=target.device)
        # alternate which goes first, so drifting machine load does not favour one side
        if i % 2 == 0:
            (ours, t_ar), (theirs, t_hf) = timed(run_ar, ids), timed(run_hf, ids)
        else:
            (theirs, t_hf), (ours, t_ar) = timed(run_hf, ids), timed(run_ar, ids)
        same = ours == theirs
        equal += same
        totals["ar"][0] += len(ours); totals["ar"][1] += t_ar
        totals["generate"][0] += len(theirs); totals["generate"][1] += t_hf
        print(f"{prompt.id:>14} {len(ours) / t_ar:9.1f} {len(theirs) / t_hf:15.1f} {str(same):>12}")
    tps = {k: n / s for k, (n, s) in totals.items()}
    print(f"\nmodel {target.name}, dtype {dtype_name(target.dtype)}, {len(prompts)} {args.dataset} prompts, "
          f"{args.max_new_tokens} new tokens max, threads {torch.get_num_threads()}")
    print(f"ar {tps['ar']:.2f} tok/s, generate {tps['generate']:.2f} tok/s, ratio ar/generate "
          f"{tps['ar'] / tps['generate']:.3f}; identical greedy tokens on {equal}/{len(prompts)} prompts")


if __name__ == "__main__":
    main()

"""Benchmark: `ar` decoding with each set of PyTorch attention (SDPA) kernels allowed, same prompts, interleaved.

On the H200 (benchmarks/RESULTS-gpu.md) a bfloat16 `ar` step took far longer than a float32 one, and
Hugging Face `generate` was as slow in bfloat16, while the latency profile's forwards (the same shapes repeated)
were equal in the two dtypes. A per-new-shape cost fits that; one suspect is cuDNN attention, which PyTorch may pick
for 16-bit inputs on Hopper and which plans each new shape (every decoding step has a new KV length). This times
`ar` with PyTorch's own choice among every kernel, with cuDNN attention excluded (specbench's default on CUDA since,
core/model/attention_kernels.py), and with the math kernel alone, and checks that the tokens are the same. On a CPU it runs
too (no cuDNN there: the first two sets should tie).

    python benchmarks/sdpa_backends.py [--dtype bfloat16] [--device cuda] [--dataset gsm8k] [--limit 4] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from specbench.core.model.load import dtype_name, load_model
from specbench.core.machine.timing import wall
from specbench.core.verify import Sampling
from specbench.data.datasets import load_prompts
from specbench.methods import get_method
from specbench.train.selfdistill import render

# name -> the SDPA kernels allowed; "all" is PyTorch's own choice among every kernel, cuDNN's included (specbench
# itself leaves cuDNN out on CUDA: core/model/attention_kernels.py)
BACKEND_SETS = {
    "all": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "no-cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "math": [SDPBackend.MATH],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dataset", default="gsm8k")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:<i>")
    args = parser.parse_args()

    target = load_model(args.model, args.dtype, args.device)
    ar = get_method("ar")(target)
    _, prompts = load_prompts(args.dataset, args.limit)

    def first_turn(prompt) -> torch.Tensor:
        return torch.tensor([render(target, prompt)], device=target.device)

    def decode(name: str, ids: torch.Tensor, n: int) -> tuple[list[int], float]:
        out: dict = {}
        with sdpa_kernel(BACKEND_SETS[name]), wall(target.device, out):
            tokens = ar.generate(ids, n, Sampling(), None).tokens
        return tokens, out["s"]

    for name in BACKEND_SETS:  # warm-up, untimed: each set's first-use costs
        decode(name, first_turn(prompts[0]), 16)

    names = list(BACKEND_SETS)
    totals = {name: [0, 0.0] for name in names}
    same = {name: 0 for name in names}
    print(f"{'prompt':>14} " + " ".join(f"{name + ' tok/s':>16}" for name in names))
    for i, prompt in enumerate(prompts):
        ids = first_turn(prompt)
        order = names[i % len(names):] + names[:i % len(names)]  # rotate who goes first: drift favours no one
        runs = {name: decode(name, ids, args.max_new_tokens) for name in order}
        for name, (tokens, seconds) in runs.items():
            totals[name][0] += len(tokens)
            totals[name][1] += seconds
            same[name] += tokens == runs["all"][0]
        print(f"{prompt.id:>14} " + " ".join(f"{len(runs[n][0]) / runs[n][1]:16.1f}" for n in names))
    tps = {name: n / s for name, (n, s) in totals.items()}
    print(f"\nmodel {target.name}, dtype {dtype_name(target.dtype)}, device {target.device}, {len(prompts)} "
          f"{args.dataset} prompts, {args.max_new_tokens} new tokens max")
    for name in names:
        print(f"{name:>9}: {tps[name]:7.2f} tok/s, {tps[name] / tps['all']:.3f}x all; tokens identical to "
              f"all's on {same[name]}/{len(prompts)} prompts")


if __name__ == "__main__":
    main()

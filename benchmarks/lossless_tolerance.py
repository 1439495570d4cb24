"""Benchmark: how far can rounding move ar's logit margin between a one-token forward and a batched one?

The calibration behind specbench/run/lossless.py's near-tie tolerance. For each prompt, greedy `ar` runs
`--steps` one-token forwards (keeping its logits); the same tokens are then re-run as one forward over the whole
prefix, and as verify chunks of 4 and 16 tokens on a KV cache (what speculative methods do). Printed, in ulps of
max |logit| at each position (ulp = the dtype's machine epsilon):
  logit      largest change of any logit
  margin     change of ar's top-1 minus top-2 margin (what flips a token)
  flip bound margin change of a chunked forward + that of the whole-prefix recomputation explain_mismatch does:
             the largest |gap| a genuine rounding flip can show

    python benchmarks/lossless_tolerance.py --dtype bfloat16 [--model smollm2-135m] [--steps 64]
"""

from __future__ import annotations

import argparse

import torch

from specbench.core.batch.cache import new_cache
from specbench.core.batch.forward import forward
from specbench.core.model.load import load_model

PROMPTS = ["Write a Python function that returns the n-th Fibonacci number.",
           "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
           "clips did Natalia sell altogether?",
           "Summarise the plot of Hamlet in three sentences.",
           "Explain what a hash table is and when to use one.",
           "Write a haiku about autumn rain.",
           'def is_prime(n):\n    """Return True if n is prime."""']


def chunked(model, ids, tokens, width):
    cache = new_cache(model)
    out = [forward(model, ids, cache, logits_to_keep=1)[-1].float()]
    i = 0
    while len(out) < len(tokens):
        chunk = tokens[i:i + width]
        i += len(chunk)
        out.extend(forward(model, torch.tensor([chunk], device=ids.device), cache).float())
    return torch.stack(out[:len(tokens)])


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=64)
    args = ap.parse_args()
    target = load_model(args.model, args.dtype, args.device)
    model, eps = target.model, torch.finfo(target.dtype).eps
    logit_err, margin_err, flip = [], [], []
    for text in PROMPTS:
        ids = torch.tensor([target.tokenizer.render([{"role": "user", "content": text}])], device=target.device)
        cache = new_cache(model)
        logits = forward(model, ids, cache, logits_to_keep=1)[-1]
        tokens, single = [], []
        for _ in range(args.steps):
            single.append(logits.float())
            tokens.append(int(logits.argmax()))
            logits = forward(model, torch.tensor([[tokens[-1]]], device=target.device), cache)[-1]
        single = torch.stack(single)
        n = ids.shape[1]
        whole = forward(model, torch.cat([ids, torch.tensor([tokens], device=target.device)], 1),
                        new_cache(model))[n - 1:n - 1 + args.steps].float()
        chunks = [chunked(model, ids, tokens, w) for w in (4, 16)]
        for k in range(args.steps):
            ulp = eps * single[k].abs().max().item()
            top = single[k].topk(2).indices
            margin = lambda row: (row[top[0]] - row[top[1]]).item()  # noqa: E731
            d_whole = abs(margin(whole[k]) - margin(single[k])) / ulp
            margin_err.append(d_whole)
            for c in chunks:
                logit_err.append((c[k] - single[k]).abs().max().item() / ulp)
                d = abs(margin(c[k]) - margin(single[k])) / ulp
                margin_err.append(d)
                flip.append(d + d_whole)
    print(f"{args.model} {args.dtype} on {target.device}: {len(PROMPTS)} prompts x {args.steps} steps; "
          "ulps of max |logit|")
    for name, xs in (("logit", logit_err), ("margin", margin_err), ("flip bound", flip)):
        xs = sorted(xs)
        q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
        print(f"  {name:10s} median {q(0.5):6.3g}  p90 {q(0.9):6.3g}  p99 {q(0.99):6.3g}  max {xs[-1]:6.3g}")


if __name__ == "__main__":
    main()

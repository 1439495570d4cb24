"""The linear layers of one forward, per CPU kernel and width: what `--compile`'s per-width choice
(core/model/linear_kernels.py) measures, printed as a table beside the bytes-over-bandwidth floor of those weights.

    python benchmarks/linear_kernels.py [--dtype float32] [--widths 1,2,4,8,16] [--rounds 9]

Run it on a quiet machine (it prints the other processes' load over the measurement); results go in
benchmarks/RESULTS-cpu.md with the hardware key."""

from __future__ import annotations

import argparse

import torch

from specbench.core.machine import contention
from specbench.core.machine.bandwidth import bandwidth
from specbench.core.machine.hardware import hardware_slug
from specbench.core.model import linear_kernels as lk
from specbench.core.model.load import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--widths", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    loaded = load_model(args.model, dtype=args.dtype, device="cpu")
    layers = lk.linears(loaded.model)
    kernels = lk.candidates(layers[0].weight.dtype)
    if "onednn" in kernels:
        lk._pack(layers)
    widths = tuple(int(w) for w in args.widths.split(","))
    weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in lk.timed_set(layers))
    floor_ms = weight_bytes / (bandwidth(torch.device("cpu")).gb_s * 1e9) * 1e3
    before = contention.snapshot()
    times = lk.measure(layers, kernels, buckets=widths, rounds=args.rounds)
    load = contention.between(before, contention.snapshot())
    print(f"{hardware_slug(torch.device('cpu'))}, {args.model} {args.dtype}, {len(lk.timed_set(layers))} linears, "
          f"{weight_bytes / 1e6:.0f} MB: bytes / bandwidth = {floor_ms:.1f} ms; median of {args.rounds} rounds; "
          f"other processes {load['foreign_cpu']:.2f} cores ({'DISTURBED' if contention.disturbed(load) else 'quiet'})")
    print("width | " + " | ".join(f"{k} ms" for k in kernels) + " | best / floor")
    for w in widths:
        t = times[w]
        print(f"{w} | " + " | ".join(f"{t[k]:.1f}" for k in kernels) + f" | {min(t.values()) / floor_ms:.2f}")


if __name__ == "__main__":
    main()

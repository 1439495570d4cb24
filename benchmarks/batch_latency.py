"""Forward latency of a batch: B samples x w new tokens each, on top of a KV cache of `--kv` tokens per sample.

EMS-SD §4.4 names the first reason speculative decoding loses ground as the batch grows: a B x w forward costs far
more than a B x 1 forward once the batch fills the hardware. This prints L(B, w) and L(B, w) / L(B, 1) for the
unpadded engine (core/batch/ragged.py), so a speedup at batch B can be set against its ceiling: speedup <= tau /
(L(B, w) / L(B, 1)), w = the verified width (sd: gamma + 1). `--mode padded` times core/batch/padded.py on the same
shapes (equal widths and KV lengths: no padding at all), which isolates what the engines themselves cost.

    python benchmarks/batch_latency.py --dtype float32 --batch-sizes 1,2,4,8,16 --widths 1,2,3,4,6,11
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specbench.core.model.load import load_model
from specbench.core.batch.ragged import Segment
from specbench.methods.batch_loop import engine as batch_engine


def measure(model, batch: int, width: int, kv: int, repeats: int, mode: str = "unpadded") -> float:
    """Median milliseconds of one forward of `batch` segments of `width` tokens over `kv` cached tokens each."""
    engine = batch_engine(model, mode, batch, next(model.parameters()).device)
    g = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().weight.shape[0]
    engine.forward([Segment(i, torch.randint(0, vocab, (kv,), generator=g).tolist(), keep=1) for i in range(batch)],
                   [])
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        segments = [Segment(i, torch.randint(0, vocab, (width,), generator=g).tolist()) for i in range(batch)]
        t0 = time.perf_counter()
        engine.forward([], segments)
        times.append((time.perf_counter() - t0) * 1e3)
        for i in range(batch):
            engine.truncate(i, kv)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16")
    parser.add_argument("--widths", default="1,2,3,4,6,11")
    parser.add_argument("--kv", type=int, default=256, help="cached tokens per sample")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--mode", default="unpadded", choices=("unpadded", "padded"))
    args = parser.parse_args()
    target = load_model(args.model, args.dtype, "cpu")
    sizes = [int(v) for v in args.batch_sizes.split(",")]
    widths = [int(v) for v in args.widths.split(",")]
    print(f"L(B, w) in ms ({target.name}, {args.dtype}, {args.mode}, KV {args.kv} per sample; L(B, w) / L(B, 1) "
          "in brackets)\n")
    print("| B | " + " | ".join(f"w={w}" for w in widths) + " |")
    print("|---|" + "---|" * len(widths))
    with torch.inference_mode():
        for b in sizes:
            row = [measure(target.model, b, w, args.kv, args.repeats, args.mode) for w in widths]
            print(f"| {b} | " + " | ".join(f"{ms:.1f} ({ms / row[0]:.2f})" for ms in row) + " |", flush=True)


if __name__ == "__main__":
    main()

"""A --device-map file that keeps a model's embeddings, final norm, LM head and its first decoder layers on the CPU
and offloads the rest to disk (accelerate reads their weights from the offload folder at every forward): the
offloaded-target measurement of RESULTS-cpu.md ("Sharded runs and offloaded targets").

Usage: python benchmarks/offload_map.py --model smollm2-135m --disk-from 15 --out half-disk.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specbench.core.model.load import model_config


def device_map(layers: int, disk_from: int) -> dict[str, str]:
    """Module name -> "cpu" or "disk"; decoder layers disk_from.. on disk."""
    where = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    where.update({f"model.layers.{i}": "disk" if i >= disk_from else "cpu" for i in range(layers)})
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--disk-from", type=int, required=True, help="first decoder layer offloaded to disk")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    layers = model_config(args.model).num_hidden_layers
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(device_map(layers, args.disk_from), indent=1))
    print(f"{args.out}: layers {args.disk_from}..{layers - 1} of {layers} on disk")


if __name__ == "__main__":
    main()

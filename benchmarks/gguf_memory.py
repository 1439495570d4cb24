"""Peak memory of loading a quantised GGUF through specbench, against the model's size in the run's dtype (issue 43).

    python benchmarks/gguf_memory.py write OUT.gguf --hidden 2048 --layers 16 --ffn 5632 [--type Q8_0]
    python benchmarks/gguf_memory.py load OUT.gguf --dtype bfloat16 [--loader transformers|tensorwise]

`write` makes a llama-architecture GGUF of random weights (normal, std 0.02), quantised with the gguf package's own
quantiser, with the embedded default's tokenizer (SmolLM2's 49152 tokens, copied from its GGUF header), so any
size can be built without a download. `load` de-quantises it in a fresh process and prints one JSON line: the
parameters, the bf16/fp32 size, the RSS before loading (python + torch + transformers imported) and the peak RSS
(VmHWM) of the load; peak minus base is what the load itself cost. Each load runs in its own process (the caller
runs this script once per measurement) so nothing of an earlier load is counted.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                  "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                  "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                  "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix")


def smollm2_gguf() -> Path:
    from specbench.core.model.gguf import embedded_gguf_path

    return embedded_gguf_path(announce=False)


def write_random_gguf(out: Path, hidden: int, layers: int, ffn: int, heads: int | None = None,
                      kv_heads: int | None = None, qtype: str = "Q8_0", seed: int = 0, tied: bool = False) -> int:
    """A llama GGUF of random weights in `qtype` (norms in F32, as llama.cpp writes them); returns its parameter
    count. Tensors are quantised and written one at a time (the writer holds only the quantised bytes). `tied`:
    no output.weight, the output head tied to the token embeddings (as llama.cpp writes such models)."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

    heads = heads or max(1, hidden // 64)
    kv_heads = kv_heads or heads
    head_dim = hidden // heads
    source = GGUFReader(str(smollm2_gguf()))
    tokens = source.fields["tokenizer.ggml.tokens"].contents()
    vocab = len(tokens)
    writer = GGUFWriter(str(out), "llama")
    writer.add_name(f"random-{hidden}x{layers}")
    writer.add_block_count(layers)
    writer.add_context_length(4096)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(vocab)
    for key in TOKENIZER_KEYS:
        field = source.fields.get(key)
        if field is None:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub)
    qt = GGMLQuantizationType[qtype]
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    if not tied:
        shapes["output.weight"] = (vocab, hidden)
    for i in range(layers):
        shapes |= {f"blk.{i}.attn_norm.weight": (hidden,), f"blk.{i}.ffn_norm.weight": (hidden,),
                   f"blk.{i}.attn_q.weight": (heads * head_dim, hidden),
                   f"blk.{i}.attn_k.weight": (kv_heads * head_dim, hidden),
                   f"blk.{i}.attn_v.weight": (kv_heads * head_dim, hidden),
                   f"blk.{i}.attn_output.weight": (hidden, heads * head_dim),
                   f"blk.{i}.ffn_gate.weight": (ffn, hidden), f"blk.{i}.ffn_up.weight": (ffn, hidden),
                   f"blk.{i}.ffn_down.weight": (hidden, ffn)}

    def tensor(index: int, shape: tuple) -> np.ndarray:
        """Tensor `index`: ones for a norm (F32), else seeded normals quantised to qt (uint8 blocks)."""
        if len(shape) == 1:
            return np.ones(shape, dtype=np.float32)
        data = np.random.default_rng([seed, index]).standard_normal(shape, dtype=np.float32) * 0.02
        return quants.quantize(data, qt)

    for name, shape in shapes.items():  # the writer wants every tensor's info before the first tensor's bytes
        if len(shape) == 1:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * shape[0])
        else:
            byte_shape = quants.quant_shape_to_byte_shape(shape, qt)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qt)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for index, shape in enumerate(shapes.values()):  # one tensor in memory at a time
        writer.write_tensor_data(tensor(index, shape))
    writer.close()
    return sum(int(np.prod(shape)) for shape in shapes.values())


def rss_mb(field: str) -> float:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1)) / 1024


def load(path: str, dtype: str, loader: str) -> dict:
    import torch

    import specbench.core.model.gguf as gguf_mod
    from specbench.core.model.load import load_model
    from specbench.core.machine.memory import _clear_hwm

    if loader == "transformers":  # the de-quantisation every GGUF went through before issue 43
        gguf_mod.TENSORWISE = False
    import transformers  # noqa: F401  (imported before the base is read: it is not the load's cost)

    base = rss_mb("VmRSS")
    _clear_hwm()
    loaded = load_model(path, dtype, "cpu")
    peak = rss_mb("VmHWM")
    params = sum(p.numel() for p in loaded.model.parameters())
    size = torch.tensor([], dtype=loaded.dtype).element_size()
    return {"file": Path(path).name, "file_mb": round(Path(path).stat().st_size / 2**20), "loader": loader,
            "dtype": dtype, "params": params, "size_mb": round(params * size / 2**20),
            "base_rss_mb": round(base), "peak_rss_mb": round(peak), "load_mb": round(peak - base),
            "ratio": round((peak - base) / (params * size / 2**20), 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("out")
    w.add_argument("--hidden", type=int, default=512)
    w.add_argument("--layers", type=int, default=8)
    w.add_argument("--ffn", type=int, default=1408)
    w.add_argument("--kv-heads", type=int, default=None)
    w.add_argument("--type", default="Q8_0")
    ld = sub.add_parser("load")
    ld.add_argument("path")
    ld.add_argument("--dtype", default="bfloat16")
    ld.add_argument("--loader", default="tensorwise", choices=("tensorwise", "transformers"))
    args = ap.parse_args()
    if args.cmd == "write":
        params = write_random_gguf(Path(args.out), args.hidden, args.layers, args.ffn, kv_heads=args.kv_heads,
                                  qtype=args.type)
        print(json.dumps({"file": args.out, "params": params, "file_mb": round(Path(args.out).stat().st_size / 2**20)}))
    else:
        print(json.dumps(load(args.path, args.dtype, args.loader)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

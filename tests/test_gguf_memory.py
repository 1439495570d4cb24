"""A quantised GGUF de-quantised tensor by tensor (core/model/gguf_tensorwise.py): the same weights as transformers'
loader, in the run's dtype, with peak memory near the model's size in that dtype (benchmarks/gguf_memory.py writes
the files and measures each load in its own process)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specbench.core.model import gguf, gguf_tensorwise

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gguf_memory.py"


def writer():
    spec = importlib.util.spec_from_file_location("gguf_memory", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_tensorwise_weights_are_transformers_loaders(tmp_path, qtype):
    from transformers import AutoModelForCausalLM

    path = tmp_path / "m.gguf"
    writer().write_random_gguf(path, hidden=64, layers=2, ffn=128, heads=4, kv_heads=2, qtype=qtype)
    assert gguf_tensorwise.architecture(path) == "llama" and gguf_tensorwise.supported("llama")
    config = gguf._gguf_config(path)
    ours = gguf_tensorwise.dequantised_model(path, config, torch.float32, "sdpa")
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    mine, ref = ours.state_dict(), theirs.state_dict()
    assert mine.keys() == ref.keys()
    for name, value in ref.items():  # llama's q/k rows un-permuted as transformers does, blocks read row by row
        assert torch.equal(mine[name], value), name
    half = gguf_tensorwise.dequantised_model(path, config, torch.bfloat16, "sdpa")
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())
    assert torch.equal(half.model.layers[1].mlp.down_proj.weight, ref["model.layers.1.mlp.down_proj.weight"].bfloat16())


def _load(path: Path, loader: str, cache: Path) -> dict:
    env = {**os.environ, "SPECBENCH_CACHE": str(cache)}
    out = subprocess.run([sys.executable, str(SCRIPT), "load", str(path), "--dtype", "bfloat16", "--loader", loader],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_gguf_loads_with_peak_memory_near_its_bf16_size(tmp_path):
    """~60M parameters in Q8_0, loaded in bfloat16 in a fresh process each way: the peak RSS over the process's base
    stays within the bf16 size + a fixed ~200 MB (the GGUF header's tokenizer, parsed for config and tokenizer),
    where transformers' loader (every tensor de-quantised to float32 first) takes over a bf16 size more."""
    path = tmp_path / "m.gguf"
    params = writer().write_random_gguf(path, hidden=512, layers=4, ffn=1024, qtype="Q8_0")
    assert 55e6 < params < 65e6
    ours = _load(path, "tensorwise", tmp_path / "cache-a")
    theirs = _load(path, "transformers", tmp_path / "cache-b")
    size = ours["size_mb"]
    assert ours["params"] == theirs["params"] == params and size == round(params * 2 / 2**20)
    assert ours["load_mb"] < size + 250, ours
    assert theirs["load_mb"] > ours["load_mb"] + size, (ours, theirs)


def test_a_gguf_with_a_tied_output_head_loads_and_runs(tmp_path, monkeypatch):
    """llama.cpp writes a model whose head is its token embeddings without an output tensor: the tensor-by-tensor
    loader ties the head (it refused such files), the cached copy keeps the tie, and `ar` decodes from it."""
    from transformers import AutoModelForCausalLM

    from specbench.core.model.load import load_model
    from specbench.core.verify import Sampling
    from specbench.methods import get_method

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tied.gguf"
    writer().write_random_gguf(path, hidden=64, layers=2, ffn=128, heads=4, kv_heads=2, qtype="Q8_0", tied=True)
    for _ in range(2):  # de-quantised from the file, then from the cached copy
        loaded = load_model(str(path), dtype="float32", device="cpu")
        model = loaded.model
        assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
        theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        assert torch.equal(model.get_output_embeddings().weight, theirs.get_output_embeddings().weight)
        ids = torch.tensor([[1, 2, 3, 4, 5]])
        tokens = get_method("ar")(loaded, {}, None).generate(ids, 4, Sampling(), None).tokens
        assert tokens == theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                                         do_sample=False)[0, 5:].tolist()

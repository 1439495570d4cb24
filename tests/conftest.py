"""Shared fixtures: tiny random-weight Llama models built in process (no downloads)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from specbench.core.model.load import load_model

# `run` re-times a disturbed prompt turn (--retime, default 2). The suite runs on every core (make test), so the
# other workers' tests always look like a neighbour: re-timing would triple every run for nothing. Tests of the
# re-timing itself pass --retime explicitly (tests/test_retime.py).
os.environ.setdefault("SPECBENCH_RETIME", "0")
# every run writes a roofline from this machine's memory bandwidth, measured once per user cache (two ~1 GiB
# buffers); tests that give runs a fresh cache would each measure it. A given bandwidth is used instead (its source
# recorded as the variable); tests/test_roofline_bandwidth.py measures for real.
os.environ.setdefault("SPECBENCH_BANDWIDTH_GB_S", "20")
# every profile states the hardware's ideal from the arithmetic peak too, measured once per user cache and dtype (a
# GEMM); a given peak is used instead, as for the bandwidth (tests/test_ideal.py measures for real)
os.environ.setdefault("SPECBENCH_PEAK_GFLOPS", "100")
# The suite runs on every core, so every profile a test measures is flagged disturbed, and runs would skip it
# (core/lookup.py). Tests of the skipping itself remove this (tests/test_data_files.py).
os.environ.setdefault("SPECBENCH_ALLOW_DISTURBED_PROFILE", "1")
# A run files its host work a step in the user cache for later predictions (planning/host_work.py): a test's
# prediction must not depend on which test ran before it. tests/test_host_work.py turns it on in a fresh cache.
os.environ.setdefault("SPECBENCH_HOST_WORK", "0")


@pytest.fixture(scope="session")
def tiny():
    """A 2-layer random Llama (vocab 260, byte tokenizer) in float32 on CPU."""
    return load_model("random:tiny", dtype="float32", device="cpu")


FOUR_LAYERS = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 260,
               "max_position_embeddings": 512, "tie_word_embeddings": True}


@pytest.fixture(scope="session")
def deep(tmp_path_factory):
    """A 4-layer random model (transfer layers 1, 2, 3 are all possible; tiny's 2 layers are too few)."""
    path = tmp_path_factory.mktemp("cfg") / "four.json"
    path.write_text(json.dumps(FOUR_LAYERS))
    return load_model(f"random:{path}", dtype="float32", device="cpu")


def prompt_ids(seed: int, length: int = 24, vocab: int = 256) -> torch.Tensor:
    """A random prompt [1, length] with a repeated stretch, so n-gram drafting has something to copy."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(0, vocab, (length,), generator=g)
    return torch.cat([head, head[: length // 2], head]).unsqueeze(0)


@pytest.fixture
def prompts_file(tmp_path):
    """A user's own JSONL with four prompts (one of them two turns), for runs through the CLI."""
    path = tmp_path / "mine.jsonl"
    rows = [{"prompt": "def add(a, b): return a + b\n" * 3}, {"instruction": "count 1 2 3 4 5 6 1 2 3"},
            {"question": "what is 12 + 30?"}, {"turns": ["hello there", "and again hello there"]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


# random artefacts of the single-model methods (medusa heads, hidden-transfer projections) for tiny test models

def _meta(target) -> dict:
    from specbench.core.artifact_files import model_key

    return {"model": target.spec, "model_key": model_key(target), "hidden_size": target.model.config.hidden_size,
            "vocab_size": target.vocab_size}


def heads_artifact(target, folder, heads=3, scale=0.05, seed=0):
    from specbench.methods.medusa import artifact as mh

    torch.manual_seed(seed)
    h = mh.MedusaHeads(target.model.config.hidden_size, heads, target.model.config.num_hidden_layers)
    torch.nn.init.normal_(h.weight, std=scale)
    mh.save(h, folder, {**_meta(target), "heads": heads, "layer": h.layer})
    return folder


def projections_artifact(target, folder, layers=None, scale=0.05, seed=0):
    from specbench.methods.hidden_transfer import artifact as tp

    torch.manual_seed(seed)
    layers = layers or list(range(1, min(4, target.model.config.num_hidden_layers)))
    p = tp.TransferProjections(target.model.config.hidden_size, list(layers))
    p.weight.data += scale * torch.randn_like(p.weight)
    tp.save(p, folder, {**_meta(target), "transfer_layers": list(layers)})
    return folder


def feature_artifact(target, folder, method="eagle", mask_tokens=0, scale=0.05, seed=0, vocab_ids=None):
    """A random feature drafter (eagle: no masks; parallelspec: mask_tokens masks): the target's last layer plus
    noise, so it agrees with the target only partly."""
    from specbench.methods.eagle import artifact as fd

    torch.manual_seed(seed)
    d = fd.FeatureDrafter(target.model, mask_tokens, vocab_ids)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(scale * torch.randn_like(p))
    fd.save(d, folder, {**_meta(target), "mask_tokens": mask_tokens}, method)
    return folder


def eagle3_artifact(target, folder, scale=0.05, seed=0, draft_tokens=None):
    """A random EAGLE-3 drafter in the published layout (the target's last layer plus noise; draft_tokens: a draft
    vocabulary of the first that many ids, else the full vocabulary)."""
    from specbench.methods.eagle3 import artifact as e3
    from specbench.methods.eagle3.drafter import initial

    torch.manual_seed(seed)
    d = initial(target.model, torch.arange(draft_tokens or target.vocab_size))
    with torch.no_grad():
        for p in d.parameters():
            p.add_(scale * torch.randn_like(p))
    e3.save(d, folder, _meta(target))
    return folder


_ARTIFACTS: dict = {}


def artifact_options(name: str, target) -> dict:
    """Options that give method `name` an artefact on `target` without training: random-real-token prompt tokens
    (ppd), random Medusa heads, transfer projections or feature drafters (made once per model); {} for others."""
    from specbench.methods import get_method

    needs = get_method(name).needs
    if "prompt tokens" in needs:
        return {"artifact": "untrained"}
    kinds = {"medusa heads": "medusa", "transfer projections": "transfer", "eagle drafter": "eagle",
             "parallelspec drafter": "parallelspec", "eagle3 drafter": "eagle3"}
    kind = next((kinds[n] for n in needs if n in kinds), None)
    if kind is None:
        return {}
    key = (kind, target.spec, target.model.config.num_hidden_layers)
    if key not in _ARTIFACTS:
        import tempfile

        folder = Path(tempfile.mkdtemp()) / kind
        make = {"medusa": lambda: heads_artifact(target, folder),
                "transfer": lambda: projections_artifact(target, folder), "eagle": lambda: feature_artifact(target, folder),
                "parallelspec": lambda: feature_artifact(target, folder, "parallelspec", 3),
                "eagle3": lambda: eagle3_artifact(target, folder)}
        _ARTIFACTS[key] = str(make[kind]())
    return {"artifact": _ARTIFACTS[key]}

"""Shared fixtures: tiny random-weight Llama models built in process (no downloads)."""

from __future__ import annotations

import json

import pytest
import torch

from specbench.core.models import load_model


@pytest.fixture(scope="session")
def tiny():
    """A 2-layer random Llama (vocab 260, byte tokenizer) in float32 on CPU."""
    return load_model("random:tiny", dtype="float32", device="cpu")


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

"""Shared fixtures: tiny random-weight Llama models built in process (no downloads)."""

from __future__ import annotations

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

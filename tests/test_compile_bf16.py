"""A compiled bfloat16 CPU forward (each width's linear kernel as measured, attention as two products and a float32
softmax: grouped_attention.py) against the eager model: the same logits to bfloat16's rounding at one row and at a
verify width, and the same greedy token wherever the eager model's top two logits are apart by more than that."""

from __future__ import annotations

import torch

from specbench.core.batch.ragged import Segment
from specbench.core.batch.static import StaticSequence
from specbench.core.model import compile as cc
from specbench.core.model.load import load_model

from .conftest import prompt_ids


def test_compiled_bfloat16_logits_follow_the_eager_model():
    target = load_model("random:tiny", dtype="bfloat16", device="cpu")
    model = target.model
    prompt = prompt_ids(0)[0].tolist()
    state = cc.enable(model, 128)
    try:
        state.buckets[(False, False, False)] = [1, 4]
        engine = StaticSequence(model, state)
        with torch.inference_mode():
            engine.forward([Segment(0, prompt, keep=1)], [])
            for tokens in ([5], [7, 8, 9, 10]):
                _, [got] = engine.forward([], [Segment(0, tokens)])
                engine.truncate(0, len(prompt))
                want = model(torch.tensor([prompt + tokens])).logits[0, -len(tokens):].float()
                got = got.float()
                assert got.shape == want.shape
                tolerance = 0.05 * want.abs().max().item()  # bfloat16: 8 bits of mantissa, a few layers deep
                assert (got - want).abs().max().item() <= tolerance, (got - want).abs().max()
                top2 = want.topk(2, dim=-1).values
                clear = (top2[:, 0] - top2[:, 1]) > 2 * tolerance
                assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
        assert (1, 1, False, False, False) in {(1, *k) for k in state.shapes} and len(state.shapes) == 2  # compiled
    finally:
        cc.disable(model)

"""Self-distillation's greedy decoding on the unpadded batch engine: the tokens of batch-1 greedy decoding, whatever
the batch, the slots and the refill order; stops and caps per sample; the progress line; the cache."""

from __future__ import annotations

import torch

from specbench.train import greedy
from specbench.train.greedy import padded_greedy, ragged_greedy


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (int(torch.randint(3, 40, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _batch1(model, prompt: list[int], new_tokens: int, stop: set[int]) -> list[int]:
    """The reference: one prompt alone, the argmax of a full forward over the growing sequence each step."""
    seq, out = list(prompt), []
    with torch.no_grad():
        for _ in range(new_tokens):
            tok = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
            out.append(tok)
            seq.append(tok)
            if tok in stop:
                break
    return out


def test_ragged_greedy_equals_batch_one_greedy(tiny):
    prompts = _prompts(11)
    want = [_batch1(tiny.model, p, 14, set()) for p in prompts]
    for slots in (1, 3, 4, 16):  # 3 and 4: slots refill while others decode; 16: all at once
        assert ragged_greedy(tiny.model, prompts, 14, [], slots=slots) == want, slots


def test_stop_tokens_end_each_sample_and_free_its_slot(tiny):
    prompts = _prompts(9, seed=1)
    free = [_batch1(tiny.model, p, 12, set()) for p in prompts]
    stop = {free[0][2], free[3][0]}  # sample 0 stops at its third token, sample 3 at its first (the prefill's)
    want = [_batch1(tiny.model, p, 12, stop) for p in prompts]
    assert len(want[0]) <= 3 and len(want[3]) == 1
    got = ragged_greedy(tiny.model, prompts, 12, sorted(stop), slots=2)
    assert got == want


def test_prefills_are_cut_into_packed_groups(tiny, monkeypatch):
    monkeypatch.setattr(greedy, "PREFILL_TOKENS", 50)  # several prefill forwards per refill, one prompt over it
    prompts = _prompts(8, seed=2) + [list(range(60))]
    want = [_batch1(tiny.model, p, 6, set()) for p in prompts]
    assert ragged_greedy(tiny.model, prompts, 6, [], slots=8) == want


def test_padded_route_gives_the_same_tokens(tiny):
    prompts = _prompts(5, seed=3)
    want = [_batch1(tiny.model, p, 8, set()) for p in prompts]
    assert padded_greedy(tiny.model, prompts, 8, [], slots=4) == want


def test_training_data_is_cached_and_the_progress_says_tokens_per_second(tiny, tmp_path, monkeypatch):
    import json

    from specbench.progress import console
    from specbench.train import selfdistill

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Say {i} and {i + 1}."}) + "\n" for i in range(6)))
    with console.capture() as captured:
        first = selfdistill.training_data(tiny, str(data), 2, 4, 9)[0]
    assert "tok/s" in captured.get() and "self-distilling" in captured.get()
    assert first.span == "2..5" and len(first.prompts) == 4 and first.dropped == ()
    files = list((tmp_path / "cache" / "selfdistill").glob("*.pt"))
    assert len(files) == 1 and files[0].name.startswith(f"{selfdistill.CACHE_FORMAT}-")

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again instead of reading the cache")

    monkeypatch.setattr(selfdistill, "ragged_greedy", no_decoding)
    again = selfdistill.training_data(tiny, str(data), 2, 4, 9)[0]
    assert again.sequences == first.sequences
    assert selfdistill.pending_prompts(tiny, str(data), 2, 4, 9) == []

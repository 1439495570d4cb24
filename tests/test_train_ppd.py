"""Prompt-token training on the tiny model: the insertion mask, the loss, the artefact, checkpoints and resume."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from specbench.core.batch.cache import new_cache
from specbench.methods.ppd import artifact as pt
from specbench.methods.ppd.training import TrainConfig, update_loss, train


def _causal(n):
    return torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]


@pytest.mark.parametrize("ept", [1, 3])
def test_insertion_blocks_equal_sequential_forwards(tiny, ept):
    """Blocks inserted after several positions on top of a cache = each block fed causally after its prefix."""
    model = tiny.model
    seq = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(0))
    table = torch.randn(2 * ept, model.config.hidden_size)  # [S * E, H]
    points = [3, 9, 17]
    with torch.no_grad():
        cache = new_cache(model)
        pt.hidden(model, pt.embed(model, seq, None), _causal(20), torch.arange(20)[None], cache)
        mask, pos, rows = pt.insertion_inputs(points, 2, ept, 20, torch.float32, "cpu")
        got = pt.hidden(model, table[rows][None], mask, pos, cache)  # [3 * 2 * E, H]
        for b, i in enumerate(points):
            for j in range(2):
                for e in range(ept):
                    prompt = table[[jj * ept + e for jj in range(j + 1)]]
                    x = pt.embed(model, seq[: i + 1], prompt)
                    n = x.shape[1]
                    ref = pt.hidden(model, x, _causal(n), torch.arange(n)[None])[-1]
                    assert torch.allclose(got[(b * 2 + j) * ept + e], ref, atol=1e-5), (b, j, e)


def test_loss_trains_only_the_prompt_tokens(tiny):
    seq = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(1))
    emb = torch.nn.Parameter(pt.untrained(tiny, 3, 1).embeddings)
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    opt = torch.optim.Adam([emb], lr=0.05)
    losses = []
    for _ in range(15):
        loss = update_loss(tiny, emb, seq, [5, 10, 20, 25], 0.8)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.8
    assert all(torch.equal(before[k], v) for k, v in tiny.model.state_dict().items())
    # alpha = 0: only prompt token 0 is trained
    emb.grad = None
    update_loss(tiny, emb, seq, [5, 10], 0.0).backward()
    assert emb.grad[0].abs().sum() > 0 and emb.grad[1:].abs().sum() == 0


def test_train_writes_artefact_and_resumes(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))  # self-distilled data stays out of ~/.cache
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Tell me about item {i}."}) + "\n" for i in range(6)))
    cfg = TrainConfig(model="random:tiny", steps=4, out=tmp_path / "ppd", prompts=4, held_out=2, new_tokens=12,
                      insertions=4, save_every=2, data_file=str(data), ept=2)
    out = train(cfg)
    meta = yaml.safe_load((out / pt.META_FILE).read_text())
    assert meta["steps"] == 4 and meta["ept"] == 2 and meta["prompt_tokens"] == 3
    assert meta["model_key"] == pt.model_key(tiny) and meta["final_loss"] > 0 and meta["train_seconds"] >= 0
    assert (out / "loss.png").is_file() and (out / pt.WEIGHTS_FILE).stat().st_size < 10_000
    assert pt.load(out, tiny).embeddings.shape == (3, 2, tiny.model.config.hidden_size)
    first = torch.load(out / "checkpoint" / "state.pt")
    assert first["step"] == 4 and len(first["losses"]) == 4
    from dataclasses import replace

    train(replace(cfg, steps=6, resume=True))
    again = torch.load(out / "checkpoint" / "state.pt")
    assert again["step"] == 6 and again["losses"][:4] == first["losses"] and len(again["losses"]) == 6


def test_train_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    from typer.testing import CliRunner

    from specbench.cli import app

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Repeat {i} twice."}) + "\n" for i in range(3)))
    res = CliRunner().invoke(app, ["train", "ppd", "--model", "random:tiny", "--steps", "2", "--prompts", "2",
                                   "--held-out", "1", "--new-tokens", "8", "--insertions", "2", "--data-file",
                                   str(data), "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "final loss" in res.output and (tmp_path / "a" / pt.WEIGHTS_FILE).is_file()
    bad = CliRunner().invoke(app, ["train", "ppd", "--model", "random:tiny", "--steps", "0"])
    assert bad.exit_code != 0 and "at least 1" in bad.output

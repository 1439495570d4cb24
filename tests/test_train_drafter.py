"""Drafter training on the tiny model: only the drafter's own layers train, the artefact loads back for `sd`,
--vocab-top restricts what is drafted, checkpoints resume, and a wrong target is refused."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import yaml

from specbench.core.verify import Sampling
from specbench.methods.sd.drafter import META_FILE, WEIGHTS_FILE, load_artifact
from specbench.methods.sd.training import DrafterConfig, train
from specbench.errors import SpecbenchError
from specbench.methods import get_method

from .conftest import prompt_ids


@pytest.fixture
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Tell me about item {i}."}) + "\n" for i in range(8)))
    return DrafterConfig(model="random:tiny", layers=1, steps=6, batch=2, out=tmp_path / "drafter", prompts=5,
                         held_out=3, new_tokens=16, eval_prompts=3, save_every=3, data=str(data), lr=3e-3)


def test_train_writes_a_loadable_drafter_and_resumes(tiny, config):
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    out = train(config)
    meta = yaml.safe_load((out / META_FILE).read_text())
    assert meta["layers"] == 1 and meta["init_layers"] == [0] and meta["steps"] == 6
    assert meta["final_loss"] < meta["initial_loss"]  # it learns (lr is high for the tiny model)
    assert 0 <= meta["agreement"] <= 1 and meta["speed_ratio_c"] > 0
    assert (out / "loss.png").is_file()
    from safetensors.torch import load_file

    stored = load_file(str(out / WEIGHTS_FILE))
    assert not any("embed" in k or "lm_head" in k for k in stored)  # embeddings and head are shared, not stored
    assert all(torch.equal(before[k], v) for k, v in tiny.model.state_dict().items())  # the target is frozen
    drafter = load_artifact(out, tiny)
    ids = prompt_ids(3)
    ar = get_method("ar")(tiny, {}).generate(ids, 24, Sampling(), None)
    sd = get_method("sd")(tiny, {"gamma": 3}, drafter).generate(ids, 24, Sampling(), None)
    assert sd.tokens == ar.tokens
    first = torch.load(out / "checkpoint" / "state.pt")
    train(replace(config, steps=9, resume=True))
    again = torch.load(out / "checkpoint" / "state.pt")
    assert again["step"] == 9 and again["losses"][:6] == first["losses"]


def test_a_mix_trains_on_every_source_and_scores_each(tiny, config):
    out = train(replace(config, data=f"{config.data},word-problems", steps=2, prompts=3, eval_prompts=2))
    meta = yaml.safe_load((out / META_FILE).read_text())
    assert meta["data"]["sequences"] == 6  # `prompts` from each source
    assert set(meta["agreement_by_source"]) == {config.data, "word-problems"}
    assert meta["agreement"] == pytest.approx(sum(meta["agreement_by_source"].values()) / 2, abs=1e-4)
    with pytest.raises(SpecbenchError, match="single --data"):
        train(replace(config, data=f"{config.data},word-problems", data_file=config.data))


def test_vocab_top_drafts_only_frequent_tokens(tiny, config):
    out = train(replace(config, vocab_top=20, steps=2))
    drafter = load_artifact(out, tiny)
    allowed = set(drafter.model.vocab_ids.tolist())
    assert len(allowed) == 20
    logits = drafter.model(prompt_ids(1)).logits[0]  # [T, V]: tokens outside the K are never drafted
    assert set(logits.argmax(-1).tolist()) <= allowed
    outside = [t for t in range(logits.shape[-1]) if t not in allowed]
    assert torch.isinf(logits[:, outside]).all() and torch.isfinite(logits[:, sorted(allowed)]).all()


def test_artefact_of_another_target_is_refused(tiny, config):
    out = train(replace(config, steps=1))
    meta = yaml.safe_load((out / META_FILE).read_text())
    meta["target_fingerprint"] = "someone-else"
    (out / META_FILE).write_text(yaml.safe_dump(meta))
    with pytest.raises(SpecbenchError, match="train drafter"):
        load_artifact(out, tiny)


def test_train_drafter_command(tmp_path, config):
    from typer.testing import CliRunner

    from specbench.cli import app

    res = CliRunner().invoke(app, ["train", "drafter", "--model", "random:tiny", "--layers", "1", "--steps", "2",
                                   "--prompts", "4", "--held-out", "2", "--new-tokens", "8", "--data",
                                   config.data, "--out", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())  # rich wraps at the console width; a long tmp path moves the break
    assert "agreement with the target" in said and (tmp_path / "d" / WEIGHTS_FILE).is_file()
    bad = CliRunner().invoke(app, ["train", "drafter", "--model", "random:tiny", "--layers", "7"])
    assert bad.exit_code != 0 and "--layers must be between 1" in bad.output

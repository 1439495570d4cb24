"""random:NAME presets of real shape: the published configurations, their parameter counts, the fast build in the
run's dtype, the tokenizer they get, and the warning at the top of a random-weight run's report."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.model.load import load_model, model_config
from specbench.core.model.loaded import ByteTokenizer
from specbench.core.model.naming import PRESET_SOURCES, RANDOM_PRESETS, model_slug
from specbench.core.model.presets import parameter_count
from specbench.core.model.random_build import build_filled

ISSUE_NAMES = ("vicuna-7b", "vicuna-13b", "llama-3.1-8b", "llama-3.1-70b", "qwen2.5-0.5b", "qwen2.5-1.5b",
               "qwen2.5-7b", "mistral-7b")


def test_every_named_preset_is_shipped_with_its_source_and_the_old_names_still_work():
    for name in (*ISSUE_NAMES, "tiny", "smollm2-135m", "llama2-7b", "llama2-13b"):
        assert name in RANDOM_PRESETS and PRESET_SOURCES[name]
        assert model_slug(f"random:{name}") == name  # the file-name key acceptance/, profiles/ and trees/ use
    for name in ISSUE_NAMES:
        assert "config.json" in PRESET_SOURCES[name]


# The models' published sizes (their model cards): what a preset's shape must add up to.
PUBLISHED_SIZES = {"vicuna-7b": 6_738_415_616, "qwen2.5-0.5b": 494_032_768, "qwen2.5-7b": 7_615_616_512,
                   "llama-3.1-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496, "mistral-7b": 7_241_732_096}


@pytest.mark.parametrize("name", sorted(PUBLISHED_SIZES))
def test_a_preset_adds_up_to_the_published_model_and_transformers_builds_that_shape(name):
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    assert parameter_count(RANDOM_PRESETS[name]) == PUBLISHED_SIZES[name]
    config = model_config(f"random:{name}")
    with init_empty_weights():  # no storage: a 70B shape costs nothing here
        model = AutoModelForCausalLM.from_config(config)
    tied = config.tie_word_embeddings
    built = sum(p.numel() for p in model.parameters()) - (config.vocab_size * config.hidden_size if tied else 0)
    assert built == PUBLISHED_SIZES[name]


QWEN_SMALL = dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
                  tie_word_embeddings=True)


def test_the_fast_build_allocates_in_the_dtype_keeps_ties_and_gives_a_finite_forward():
    from transformers import AutoConfig

    cfg = dict(QWEN_SMALL)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = build_filled(config, torch.bfloat16, torch.device("cpu"), "sdpa")
    params = dict(model.named_parameters())
    assert all(p.dtype == torch.bfloat16 and p.device.type == "cpu" for p in params.values())
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as the config says
    q = model.model.layers[0].self_attn.q_proj
    assert torch.all(q.bias == 0) and torch.all(model.model.norm.weight == 1)
    assert not torch.equal(q.weight[0], q.weight[1])  # the tiled block does not repeat row by row
    assert abs(float(q.weight.float().std()) - 0.02) < 0.002
    again = build_filled(config, torch.bfloat16, torch.device("cpu"), "sdpa")
    assert torch.equal(again.model.layers[1].mlp.up_proj.weight, model.model.layers[1].mlp.up_proj.weight)  # seeded
    inv = model.model.rotary_emb.inv_freq
    assert inv.device.type == "cpu" and torch.isfinite(inv).all() and inv[0] == 1.0  # RoPE's buffer computed for real
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert logits.shape == (1, 4, 300) and torch.isfinite(logits).all() and logits.float().std() > 0


def test_a_vocabulary_below_the_embedded_tokenizer_gets_bytes_not_out_of_range_ids(tmp_path):
    path = tmp_path / "small-vocab.json"
    path.write_text(json.dumps(dict(RANDOM_PRESETS["tiny"], vocab_size=1000)))
    target = load_model(f"random:{path}", "float32", "cpu")
    assert isinstance(target.tokenizer.backend, ByteTokenizer)  # SmolLM2's ids reach 49151: past a 1000-row table


def test_a_run_on_random_weights_says_so_at_the_top_of_its_report(tmp_path, prompts_file):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--model", "random:tiny", "--method", "pld", "--dataset",
                                      str(prompts_file), "--limit", "1", "--max-new-tokens", "8", "--warmup", "0",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    head = "\n".join((out / "report.md").read_text().splitlines()[:6])
    assert "Random weights" in head and "random:tiny" in head and "say nothing about a trained model" in head


def test_an_estimate_on_random_weights_says_so_in_its_file(tmp_path):
    from specbench.methods import REGISTRY  # noqa: F401  (first: the guessers and planning.acceptance import each other)
    from specbench.planning.acceptance import write

    for spec, warned in (("random:vicuna-7b", True), ("smollm2-135m", False)):
        path = tmp_path / f"{warned}.yaml"
        write({"method": "ppd", "model": spec, "per_rank": [[0.5]]}, path)
        head = path.read_text().splitlines()[:2]
        assert ("Random weights" in head[1]) is warned and head[0].startswith("# specbench estimate")

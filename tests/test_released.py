"""The authors' released drafters through --artifact: EAGLE-1/2 checkpoints (SafeAILab/EAGLE's layout) and Medusa
heads (FasterDecoding/Medusa's layout), written here from known tensors. The loaded drafter must compute what the
published architecture computes (a direct computation written out below, not specbench's code), decode losslessly,
and a folder of another layout or another target's shapes is refused with the files and shapes named."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.verify import Sampling
from specbench.errors import SpecbenchError
from specbench.methods import get_method
from specbench.methods.eagle import artifact as fd
from specbench.methods.medusa import artifact as mh

from .conftest import prompt_ids


def _ar(target, ids, n):
    return get_method("ar")(target).generate(ids, n, Sampling(), None).tokens


# ---- EAGLE-1/2 -------------------------------------------------------------------------------------------------

def eagle_config(target, **changes) -> dict:
    """config.json as the releases carry it: a Llama config of the one-layer drafter."""
    cfg = target.model.config
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "num_hidden_layers": 1, "rms_norm_eps": cfg.rms_norm_eps, "vocab_size": target.vocab_size,
            "max_position_embeddings": 2048, "torch_dtype": "float16", **changes}


def eagle_state(target, seed=0, bias=True) -> dict[str, torch.Tensor]:
    """Known random tensors under the published names, the target's embedding stored beside them."""
    g = torch.Generator().manual_seed(seed)
    cfg = target.model.config
    h, i = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)

    def rand(*shape, scale=0.15):
        return scale * torch.randn(*shape, generator=g)

    state = {"fc.weight": rand(h, 2 * h), "layers.0.self_attn.q_proj.weight": rand(h, h),
             "layers.0.self_attn.k_proj.weight": rand(kv, h), "layers.0.self_attn.v_proj.weight": rand(kv, h),
             "layers.0.self_attn.o_proj.weight": rand(h, h), "layers.0.mlp.gate_proj.weight": rand(i, h),
             "layers.0.mlp.up_proj.weight": rand(i, h), "layers.0.mlp.down_proj.weight": rand(h, i),
             "layers.0.post_attention_layernorm.weight": 1 + rand(h, scale=0.3),
             "embed_tokens.weight": target.model.get_input_embeddings().weight.detach().clone()}
    if bias:
        state["fc.bias"] = rand(h, scale=0.5)
    return state


def write_eagle(folder, target, fmt="bin", config=None, state=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or eagle_config(target)))
    state = state if state is not None else eagle_state(target)
    if fmt == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder


def eagle_reference(w, cfg, emb, head, feats, tokens, bias=True):
    """The published EAGLE-1/2 drafter written out: u = fc([e(x_{i+1}) ; f_i]) (+ bias); one Llama layer whose
    attention reads u without an input norm (RoPE at positions 0..n-1, causal, grouped keys / values), then the
    post-attention RMS norm and SwiGLU MLP, both residual; no final norm; the target's head on the result."""
    n, hidden = len(tokens), cfg["hidden_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = hidden // heads
    u = torch.cat([emb[tokens], feats], -1) @ w["fc.weight"].T  # [n, H]
    if bias:
        u = u + w["fc.bias"]
    a = "layers.0.self_attn."
    q = (u @ w[a + "q_proj.weight"].T).view(n, heads, d).transpose(0, 1)  # [heads, n, d]
    k = (u @ w[a + "k_proj.weight"].T).view(n, kv_heads, d).transpose(0, 1)  # [kv_heads, n, d]
    v = (u @ w[a + "v_proj.weight"].T).view(n, kv_heads, d).transpose(0, 1)
    inv = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, d, 2).float() / d))  # [d/2]
    angle = torch.arange(n).float()[:, None] * inv[None]  # [n, d/2]
    cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()  # [n, d]

    def rotate(t):
        return t * cos + torch.cat([-t[..., d // 2:], t[..., : d // 2]], -1) * sin

    q, k = rotate(q), rotate(k)
    k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
    scores = q @ k.transpose(1, 2) / math.sqrt(d)  # [heads, n, n]
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, hidden)  # [n, H]
    x = u + attended @ w[a + "o_proj.weight"].T
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"])
    m = normed * w["layers.0.post_attention_layernorm.weight"]
    x = x + (F.silu(m @ w["layers.0.mlp.gate_proj.weight"].T) * (m @ w["layers.0.mlp.up_proj.weight"].T)) \
        @ w["layers.0.mlp.down_proj.weight"].T
    return x @ head.T  # [n, V]


@pytest.mark.parametrize("fmt,bias", [("bin", True), ("safetensors", True), ("bin", False)])
def test_eagle_release_computes_the_published_drafter(tiny, tmp_path, fmt, bias):
    cfg = eagle_config(tiny) if bias else eagle_config(tiny, bias=False)
    state = eagle_state(tiny, bias=bias)
    folder = write_eagle(tmp_path / "eagle", tiny, fmt, cfg, state)
    art = fd.resolve(str(folder), tiny, "eagle")
    drafter = art.drafter
    assert "EAGLE-1/2 release" in art.source and drafter.variant == {"fc_bias": bias, "input_norm": False,
                                                                       "final_norm": False}
    ids = prompt_ids(3)[0, :20]
    with torch.no_grad():
        feats = tiny.model.model(input_ids=ids[None]).last_hidden_state[0, :-1]  # f_0..f_{n-1}, normed [n, H]
        tokens = ids[1:]  # x_1..x_n
        emb, head = tiny.model.get_input_embeddings().weight, tiny.model.get_output_embeddings().weight
        want = eagle_reference(state, cfg, emb, head, feats, tokens, bias)
        got = drafter.logits(drafter.run(drafter.fuse(feats, tokens)[None], torch.arange(len(tokens))[None]))
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
    # and not by accident: specbench's own drafter layout (input norm, final norm) gives other logits
    own = fd.FeatureDrafter(tiny.model, fc_bias=bias)
    own.load_state_dict(drafter.state_dict(), strict=False)
    with torch.no_grad():
        other = own.logits(own.run(own.fuse(feats, tokens)[None], torch.arange(len(tokens))[None]))
    assert not torch.allclose(other, want, atol=1e-2)


@pytest.mark.parametrize("options", [{"tree": "size=6"}, {"tree": "dynamic=8"}, {"gamma": 3}])
def test_eagle_release_decodes_losslessly(tiny, tmp_path, options):
    folder = write_eagle(tmp_path / "eagle", tiny)
    method = get_method("eagle")(tiny, {"artifact": str(folder), **options})
    for seed in range(2):
        ids = prompt_ids(seed)
        assert method.generate(ids, 30, Sampling(), None).tokens == _ar(tiny, ids, 30)


def test_eagle_release_of_another_target_is_refused(tiny, tmp_path):
    big = write_eagle(tmp_path / "vicuna", tiny, config=eagle_config(tiny, hidden_size=4096, vocab_size=32000))
    with pytest.raises(SpecbenchError, match=r"hidden size 4096, vocabulary 32000.*not for random:tiny "
                                             r"\(hidden size 64, vocabulary 260.*belongs to the one target"):
        fd.resolve(str(big), tiny, "eagle")
    wide = write_eagle(tmp_path / "wide", tiny, config=eagle_config(tiny, intermediate_size=256))
    with pytest.raises(SpecbenchError, match=r"intermediate size 256.*intermediate size 128"):
        fd.resolve(str(wide), tiny, "eagle")
    # same shapes, another model: the embedding it stores is not this target's
    state = eagle_state(tiny)
    state["embed_tokens.weight"] = state["embed_tokens.weight"] + 0.01 * torch.randn(260, 64)
    other = write_eagle(tmp_path / "other", tiny, state=state)
    with pytest.raises(SpecbenchError, match=r"embedding it stores .* differs from random:tiny's"):
        fd.resolve(str(other), tiny, "eagle")
    theta = write_eagle(tmp_path / "theta", tiny, config=eagle_config(tiny, rope_theta=500000.0))
    with pytest.raises(SpecbenchError, match=r"RoPE is theta 500000, random:tiny's theta 10000; .*would not "
                                             r"compute the authors' drafter"):
        fd.resolve(str(theta), tiny, "eagle")
    two = write_eagle(tmp_path / "two", tiny, config=eagle_config(tiny, num_hidden_layers=2))
    with pytest.raises(SpecbenchError, match="one decoder layer"):
        fd.resolve(str(two), tiny, "eagle")


def test_eagle_release_with_wrong_content_is_refused(tiny, tmp_path):
    no_bias = write_eagle(tmp_path / "nobias", tiny, state=eagle_state(tiny, bias=False))  # config: bias absent
    with pytest.raises(SpecbenchError, match=r"no fc.bias.*\"bias\": false"):
        fd.resolve(str(no_bias), tiny, "eagle")
    state = eagle_state(tiny)
    del state["layers.0.mlp.up_proj.weight"]
    with pytest.raises(SpecbenchError, match=r"no tensor layers.0.mlp.up_proj.weight"):
        fd.resolve(str(write_eagle(tmp_path / "missing", tiny, state=state)), tiny, "eagle")
    state = {**eagle_state(tiny), "layers.0.self_attn.q_proj.bias": torch.zeros(64)}
    with pytest.raises(SpecbenchError, match=r"q_proj.bias have no place"):
        fd.resolve(str(write_eagle(tmp_path / "extra", tiny, state=state)), tiny, "eagle")
    eagle3 = write_eagle(tmp_path / "eagle3", tiny, config=eagle_config(tiny, draft_vocab_size=32))
    with pytest.raises(SpecbenchError, match="EAGLE-3 drafter"):
        fd.resolve(str(eagle3), tiny, "eagle")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "pytorch_model.bin").write_bytes(b"not a checkpoint")
    (tmp_path / "junk" / "config.json").write_text(json.dumps(eagle_config(tiny)))
    with pytest.raises(SpecbenchError, match=r"pytorch_model.bin: cannot read it"):
        fd.resolve(str(tmp_path / "junk"), tiny, "eagle")


# ---- Medusa ----------------------------------------------------------------------------------------------------

def medusa_state(target, heads=3, blocks=1, own=True, seed=1) -> dict[str, torch.Tensor]:
    """The heads' ModuleList state dict: <head>.<block>.linear.{weight,bias}, <head>.<blocks>.weight."""
    g = torch.Generator().manual_seed(seed)
    h, v = target.model.config.hidden_size, target.vocab_size
    state = {}
    for k in range(heads):
        for j in range(blocks):
            state[f"{k}.{j}.linear.weight"] = 0.3 * torch.randn(h, h, generator=g)
            state[f"{k}.{j}.linear.bias"] = 0.3 * torch.randn(h, generator=g)
        if own:
            state[f"{k}.{blocks}.weight"] = 0.2 * torch.randn(v, h, generator=g)
    return state


def write_medusa(folder, state, fmt="pt", config=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or {"medusa_num_heads": 2, "medusa_num_layers": 1,
                                                              "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
    if fmt == "pt":
        torch.save(state, folder / "medusa_lm_head.pt")
    else:
        save_file(state, str(folder / "medusa_lm_head.safetensors"))
    return folder


def medusa_reference(state, lm_head, h, heads, blocks, own):
    """Medusa's head k written out: L residual blocks s + SiLU(W s + b), then its own W2 (or the base LM head)."""
    out = []
    for k in range(heads):
        s = h
        for j in range(blocks):
            s = s + F.silu(s @ state[f"{k}.{j}.linear.weight"].T + state[f"{k}.{j}.linear.bias"])
        out.append(s @ (state[f"{k}.{blocks}.weight"] if own else lm_head).T)
    return torch.stack(out)  # [K, n, V]


@pytest.mark.parametrize("fmt,blocks,own", [("pt", 1, True), ("safetensors", 1, True), ("pt", 2, True),
                                            ("safetensors", 1, False)])
def test_medusa_release_computes_the_published_heads(tiny, tmp_path, fmt, blocks, own):
    state = medusa_state(tiny, heads=3, blocks=blocks, own=own)
    folder = write_medusa(tmp_path / "m", state, fmt, {"medusa_num_heads": 2, "medusa_num_layers": blocks,
                                                       "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"})
    art = mh.resolve(str(folder), tiny)
    assert art.heads.heads == 3  # the file's count, not the config's (the authors' loader builds the file's heads)
    assert "Medusa release for lmsys/vicuna-7b-v1.3" in art.source
    lm_head = tiny.model.get_output_embeddings()
    with torch.no_grad():
        h = tiny.model.model(input_ids=prompt_ids(2)).last_hidden_state[0]  # [n, H]
        want = medusa_reference(state, lm_head.weight, h, 3, blocks, own)
        got = art.heads.logits(lm_head, h)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


def test_medusa_release_decodes_losslessly(tiny, tmp_path):
    folder = write_medusa(tmp_path / "m", medusa_state(tiny, heads=4))
    method = get_method("medusa")(tiny, {"artifact": str(folder), "tree": "size=8"})
    for seed in range(2):
        ids = prompt_ids(seed)
        assert method.generate(ids, 30, Sampling(), None).tokens == _ar(tiny, ids, 30)


def test_medusa_release_of_another_target_or_malformed_is_refused(tiny, tmp_path):
    state = {k: (torch.zeros(32000, 64) if k.endswith("1.weight") else v) for k, v in medusa_state(tiny).items()}
    with pytest.raises(SpecbenchError, match=r"vocabulary 32000 \(trained for lmsys/vicuna-7b-v1.3\), not for "
                                             r"random:tiny \(hidden size 64, vocabulary 260\)"):
        mh.resolve(str(write_medusa(tmp_path / "vocab", state)), tiny)
    with pytest.raises(SpecbenchError, match=r"says medusa_num_layers 2, medusa_lm_head.pt holds 1"):
        mh.resolve(str(write_medusa(tmp_path / "layers", medusa_state(tiny),
                                    config={"medusa_num_heads": 3, "medusa_num_layers": 2})), tiny)
    state = medusa_state(tiny)
    del state["1.0.linear.bias"]
    with pytest.raises(SpecbenchError, match=r"head 1 holds .*expected 1.0.linear.bias"):
        mh.resolve(str(write_medusa(tmp_path / "partial", state)), tiny)
    with pytest.raises(SpecbenchError, match=r"`lm_head.weight` is not a Medusa head's"):
        mh.resolve(str(write_medusa(tmp_path / "whole", {"lm_head.weight": torch.zeros(260, 64)})), tiny)


# ---- the --artifact seam ---------------------------------------------------------------------------------------

def test_a_folder_of_no_known_layout_names_every_layout(tiny, tmp_path):
    (tmp_path / "neither").mkdir()
    (tmp_path / "neither" / "weights.bin").write_bytes(b"")
    with pytest.raises(SpecbenchError, match=r"holds no EAGLE drafter \(expected eagle.yaml .*or an EAGLE-1/2 "
                                             r"release \(config.json with pytorch_model.bin or model.safetensors\)"):
        fd.resolve(str(tmp_path / "neither"), tiny, "eagle")
    with pytest.raises(SpecbenchError, match=r"expected medusa.yaml .*or Medusa's released heads "
                                             r"\(medusa_lm_head.pt or medusa_lm_head.safetensors"):
        mh.resolve(str(tmp_path / "neither"), tiny)
    with pytest.raises(SpecbenchError, match=r"nowhere: no such folder"):
        mh.resolve(str(tmp_path / "nowhere"), tiny)


def test_cli_run_and_estimate_take_a_release(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    eagle = write_eagle(tmp_path / "EAGLE-tiny", tiny)
    medusa = write_medusa(tmp_path / "medusa-tiny", medusa_state(tiny))
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Say {i} {i} {i} again."}) + "\n" for i in range(2)))
    runner = CliRunner()
    common = ["--model", "random:tiny", "--dtype", "float32", "--device", "cpu"]
    res = runner.invoke(app, ["run", "--method", "eagle", "--artifact", str(eagle), "--tree", "size=4", *common,
                              "--dataset", str(data), "--limit", "1", "--max-new-tokens", "8", "--warmup", "0",
                              "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert "100%" in res.output  # lossless against ar
    res = runner.invoke(app, ["estimate", "--method", "medusa", "--artifact", str(medusa), *common, "--limit", "1",
                              "--new-tokens", "8", "--data-file", str(data), "--out", str(tmp_path / "m.yaml")])
    assert res.exit_code == 0, res.output
    assert "Medusa release" in " ".join(res.output.split())
    res = runner.invoke(app, ["run", "--method", "eagle", "--artifact", str(medusa), *common, "--dataset", str(data),
                              "--limit", "1", "--max-new-tokens", "8", "--warmup", "0", "--out", str(tmp_path / "r2")])
    said = " ".join(res.output.split())
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert "eagle.yaml" in said and "config.json with pytorch_model.bin" in said


def test_training_goes_on_from_a_release_in_its_layout(tiny, tmp_path, monkeypatch):
    """`train eagle --init <release>` keeps the release's layout (fc bias, no input or final norm): the saved
    drafter, loaded back, is the release's function after a step that barely moves it."""
    from specbench.methods.eagle.training import FeatureConfig, train

    monkeypatch.setenv("HOME", str(tmp_path))  # the self-distillation cache
    release = write_eagle(tmp_path / "release", tiny)
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Name {i} and {i + 3} twice."}) + "\n" for i in range(4)))
    out = train(FeatureConfig(method="eagle", model=tiny.spec, data=str(data), prompts=3, held_out=1, new_tokens=8,
                              dtype="float32", device="cpu", sequences=2, kl_rows=8, vocab_top=None, steps=1,
                              lr=1e-9, init=str(release), out=tmp_path / "tuned"))
    tuned = fd.load(out, tiny, "eagle")
    assert tuned.drafter.variant == {"fc_bias": True, "input_norm": False, "final_norm": False}
    assert tuned.meta["init_from"].startswith(str(release))
    start = fd.resolve(str(release), tiny, "eagle").drafter
    feats, tokens = torch.randn(6, 64), prompt_ids(4)[0, 1:7]
    with torch.no_grad():
        a, b = (d.logits(d.run(d.fuse(feats, tokens)[None], torch.arange(6)[None])) for d in (start, tuned.drafter))
    assert torch.allclose(a, b, atol=0.05, rtol=0.05)  # bfloat16 storage rounds


def test_released_drafters_keep_the_target_distribution(tiny, tmp_path):
    """T > 0: drafts sampled from a release's q (Medusa's own projections, EAGLE's layout) are accepted by
    multi-candidate speculative sampling: the target's distribution."""
    from .test_sd import check_distribution

    head = tiny.model.get_output_embeddings().weight.detach()
    state = {k: (head + 0.05 * torch.randn_like(head) if k.endswith(".1.weight") else v)
             for k, v in medusa_state(tiny, heads=3).items()}  # near the target's head: acceptance is partial
    medusa = get_method("medusa")(tiny, {"artifact": str(write_medusa(tmp_path / "m", state)), "tree": "size=8"})
    assert check_distribution(medusa, tiny, trials=800) < 0.1
    eagle = get_method("eagle")(tiny, {"artifact": str(write_eagle(tmp_path / "e", tiny)), "tree": "size=6"})
    assert check_distribution(eagle, tiny, trials=800) < 0.1

"""A model that is not the embedded default (issue 16): sliding-window attention, GGUF files, memory checks, and
prompts of a model without a chat template."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.model import fit
from specbench.core.model import load as models
from specbench.core.batch.cache import drop_last, new_cache, window_mask
from specbench.core.model.load import load_model
from specbench.core.verify import Sampling
from specbench.errors import SpecbenchError
from specbench.planning.profile import measure
from specbench.methods import REGISTRY

from .conftest import prompt_ids
from .test_methods import build

WINDOW = 16
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=260, max_position_embeddings=512)
SLIDING = {
    # every layer slides (Mistral: one 4-D mask for all layers)
    "mistral": dict(SMALL, model_type="mistral", sliding_window=WINDOW),
    # layer 0 full attention, layer 1 sliding (Qwen2's max_window_layers: a hybrid, masks per layer type)
    "qwen2": dict(SMALL, model_type="qwen2", sliding_window=WINDOW, use_sliding_window=True, max_window_layers=1),
}


def _config_file(folder, name, cfg):
    path = folder / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module", params=sorted(SLIDING))
def sliding(request, tmp_path_factory):
    """A tiny random model with a 16-token sliding window, no stop tokens (every generation runs to the cap)."""
    path = _config_file(tmp_path_factory.mktemp("sw"), request.param, SLIDING[request.param])
    target = load_model(f"random:{path}", "float32", "cpu")
    target.tokenizer.stop_ids = ()
    return target


def _hf_generate(target, ids, n):
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


# ------------------------------------------------------------------------------------------ sliding windows

def test_sliding_model_really_slides(sliding):
    assert sliding.model.config.sliding_window == WINDOW
    assert any(type(layer) is DynamicSlidingWindowLayer for layer in DynamicCache(config=sliding.model.config).layers)
    assert not any(getattr(layer, "is_sliding", False) for layer in new_cache(sliding.model).layers)


def test_every_method_is_lossless_past_the_window(sliding):
    ids = prompt_ids(0, length=24)  # 60 tokens, then 40 more: far past the 16-token window
    assert ids.shape[1] > 3 * WINDOW
    reference = build("ar", sliding).generate(ids, 40, Sampling(), None).tokens
    assert len(reference) == 40
    assert reference == _hf_generate(sliding, ids, 40)  # transformers' own windowed cache
    for name in sorted(REGISTRY):
        got = build(name, sliding).generate(ids, 40, Sampling(), None)
        assert got.tokens == reference, name
        assert sum(got.accepted_lengths) == len(got.tokens)


def test_the_window_changes_the_output(tmp_path):
    """Without the window the same weights decode differently: the lossless test above is not vacuous."""
    windowed = load_model(f"random:{_config_file(tmp_path, 'w', SLIDING['mistral'])}", "float32", "cpu")
    full = load_model(f"random:{_config_file(tmp_path, 'f', dict(SLIDING['mistral'], sliding_window=None))}",
                      "float32", "cpu")
    ids = prompt_ids(0, length=24)
    windowed.tokenizer.stop_ids = full.tokenizer.stop_ids = ()
    assert build("ar", windowed).generate(ids, 24, Sampling(), None).tokens != \
        build("ar", full).generate(ids, 24, Sampling(), None).tokens


def test_sampling_past_the_window_runs(sliding):
    ids = prompt_ids(4, length=24)
    for name in sorted(REGISTRY):
        gen = build(name, sliding).generate(ids, 24, Sampling(temperature=1.0), torch.Generator().manual_seed(1))
        assert len(gen.tokens) == 24, name


def test_profile_kv_lengths_past_the_window(sliding):
    prof = measure(sliding, widths=(1, 4), kv_lengths=(8, 3 * WINDOW), repeats=1, warmup=1)
    assert sorted(prof.curves) == [8, 3 * WINDOW]


def test_window_mask_per_layer_kind(sliding):
    q, past = 3, 40
    mask = torch.zeros(1, 1, q, past + q)
    pos = torch.tensor([[past, past + 1, past + 1]])  # a tree: two siblings at the same position
    got = window_mask(sliding.model, mask, pos)
    windowed = got if isinstance(got, torch.Tensor) else got["sliding_attention"]
    if sliding.model.config.model_type == "qwen2":
        assert set(got) == {"full_attention", "sliding_attention"} and torch.equal(got["full_attention"], mask)
    seen = windowed[0, 0] == 0  # [q, kv]
    assert seen[0].nonzero().flatten().tolist()[0] == past - WINDOW + 1  # the query itself and 15 before it
    assert seen[2].nonzero().flatten().tolist()[0] == past + 1 - WINDOW + 1
    assert seen[:, -q:].all()  # within the window: what the tree mask allowed stays allowed
    llama = load_model("random:tiny", "float32", "cpu").model
    assert window_mask(llama, mask, pos) is mask


def test_a_cache_that_cannot_roll_back_is_a_clear_error():
    cache = DynamicCache()
    cache.layers[:] = [DynamicSlidingWindowLayer(sliding_window=4)]
    cache.layers[0].update(torch.zeros(1, 1, 6, 2), torch.zeros(1, 1, 6, 2))
    with pytest.raises(SpecbenchError, match="cannot drop rejected tokens"):
        drop_last(cache, 2)
    full = DynamicCache()
    full.layers[:] = [DynamicLayer()]
    full.layers[0].update(torch.zeros(1, 1, 6, 2), torch.zeros(1, 1, 6, 2))
    drop_last(full, 2)
    assert full.get_seq_length() == 4


def test_run_pld_on_a_long_prompt_past_the_window(tmp_path):
    config = _config_file(tmp_path, "mistral-sw", SLIDING["mistral"])
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "the cat sat on the mat; " * 12}) + "\n")  # ~290 tokens > 16
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "--model", f"random:{config}", "--method", "pld", "--dataset",
                                   str(prompts), "--max-new-tokens", "24", "--warmup", "0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    meta = yaml.safe_load((out / "run.yaml").read_text())
    assert meta["model"]["rendering"] == "plain text"
    assert "no chat template" in res.output


# -------------------------------------------------------------------------------------------------- GGUF

def _bytes_to_unicode() -> list[str]:
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return [chars[b] for b in range(256)]


def write_gguf(path, seed: int = 0, chat_template: str | None = None) -> None:
    """A tiny Llama GGUF (hidden 32, 2 layers, byte-level BPE vocabulary of 259) written with gguf.GGUFWriter."""
    import gguf

    tokens = _bytes_to_unicode() + ["Ġt", "he", "<|endoftext|>"]
    vocab, hidden, inter, layers, heads, kv = len(tokens), 32, 64, 2, 4, 2
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (vocab - 1) + [3])  # the last one is a control token
    w.add_token_merges(["Ġ t", "h e"])
    w.add_bos_token_id(vocab - 1)
    w.add_eos_token_id(vocab - 1)
    if chat_template:
        w.add_chat_template(chat_template)
    rng = np.random.default_rng(seed)

    def rand(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    rand("token_embd.weight", vocab, hidden)
    for i in range(layers):
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, np.float32))
        rand(f"blk.{i}.attn_q.weight", hidden, hidden)
        rand(f"blk.{i}.attn_k.weight", kv * hidden // heads, hidden)
        rand(f"blk.{i}.attn_v.weight", kv * hidden // heads, hidden)
        rand(f"blk.{i}.attn_output.weight", hidden, hidden)
        rand(f"blk.{i}.ffn_gate.weight", inter, hidden)
        rand(f"blk.{i}.ffn_up.weight", inter, hidden)
        rand(f"blk.{i}.ffn_down.weight", hidden, inter)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    rand("output.weight", vocab, hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def gguf_conversions(monkeypatch, tmp_path):
    """Point the cache at a fresh folder; count the de-quantisations (gguf._dequantised calls, by file name)."""
    from specbench.core.model import gguf

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    calls = []
    original = gguf._dequantised

    def counting(path, *args, **kwargs):
        calls.append(path.name)
        return original(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "_dequantised", counting)
    return calls


def test_gguf_is_dequantised_once_and_cached(tmp_path, gguf_conversions):
    path = tmp_path / "my-model.gguf"
    write_gguf(path)
    ids = torch.tensor([[256, 72, 101, 108, 108, 111, 32, 257]])
    first = load_model(str(path), "float32", "cpu")
    assert gguf_conversions == ["my-model.gguf"]
    assert first.spec == str(path) and first.name == "my-model"
    cached = list((tmp_path / "cache" / "models").glob("gguf-my-model-*-float32"))
    assert len(cached) == 1 and (cached[0] / "model.safetensors").is_file()
    second = load_model(str(path), "float32", "cpu")
    third = load_model(str(path), "bfloat16", "cpu")  # every dtype loads the float32 copy
    assert gguf_conversions == ["my-model.gguf"]  # no second de-quantisation
    assert third.model.dtype == torch.bfloat16
    with torch.inference_mode():
        assert torch.equal(first.model(ids).logits, second.model(ids).logits)
    assert first.tokenizer.render([{"role": "user", "content": "hello"}]) == \
        second.tokenizer.render([{"role": "user", "content": "hello"}])
    assert second.tokenizer.stop_ids == first.tokenizer.stop_ids
    assert models.model_config(str(path)).num_hidden_layers == 2
    assert gguf_conversions == ["my-model.gguf"]  # the config comes from the header


def test_gguf_cache_key_follows_content_not_name_or_mtime(tmp_path, gguf_conversions):
    path = tmp_path / "m.gguf"
    write_gguf(path, seed=0)
    key = models.gguf_content_key(path)
    copy = tmp_path / "copy" / "m.gguf"
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())  # a copy: new mtime and folder, same content
    assert models.gguf_content_key(copy) == key
    load_model(str(path), "float32", "cpu")
    load_model(str(copy), "float32", "cpu")
    assert len(gguf_conversions) == 1
    write_gguf(path, seed=1)  # other weights, same size and name
    assert path.stat().st_size == copy.stat().st_size and models.gguf_content_key(path) != key
    load_model(str(path), "float32", "cpu")
    assert len(gguf_conversions) == 2


def test_gguf_prompt_rendering_is_recorded(tmp_path, gguf_conversions, capsys):
    plain, chat = tmp_path / "plain.gguf", tmp_path / "chat.gguf"
    write_gguf(plain)
    write_gguf(chat, chat_template="{% for m in messages %}<|endoftext|>{{ m['content'] }}{% endfor %}"
                                   "{% if add_generation_prompt %}<|endoftext|>{% endif %}")
    with_template = load_model(str(chat), "float32", "cpu")
    without = load_model(str(plain), "float32", "cpu")
    assert with_template.prompt_format == "chat template" and without.prompt_format == "plain text"
    capsys.readouterr()
    with_template.tokenizer.render([{"role": "user", "content": "hi"}])
    assert "no chat template" not in capsys.readouterr().err
    for _ in range(3):
        without.tokenizer.render([{"role": "user", "content": "hi"}])
    err = capsys.readouterr().err
    assert err.count("no chat template") == 1 and "plain" in err  # once per loaded model


def test_a_broken_gguf_is_a_clear_error(tmp_path, gguf_conversions):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all" * 100)
    with pytest.raises(SpecbenchError, match="bad.gguf"):
        load_model(str(bad), "float32", "cpu")
    with pytest.raises(SpecbenchError, match="not found"):
        load_model(str(tmp_path / "missing.gguf"), "float32", "cpu")


# ----------------------------------------------------------------------------------------- memory checks

@pytest.fixture
def from_config_devices(monkeypatch):
    """The default device and dtype of every AutoModelForCausalLM.from_config call (meta = nothing allocated)."""
    seen = []
    original = AutoModelForCausalLM.from_config.__func__

    def spying(cls, config, **kwargs):
        seen.append((str(torch.get_default_device()), kwargs.get("dtype")))
        return original(cls, config, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_config", classmethod(spying))
    return seen


def test_a_model_too_big_for_free_memory_is_refused_before_it_is_built(monkeypatch, from_config_devices):
    monkeypatch.setattr(fit, "free_memory_bytes", lambda device: 8 * 2**30)
    with pytest.raises(SpecbenchError) as err:
        load_model("random:llama2-7b", "bfloat16", "cpu")
    said = str(err.value)
    assert "random:llama2-7b" in said and "6.74B parameters in bfloat16" in said
    assert "8.0 GiB" in said and "largest preset that fits here: --model random:qwen2.5-1.5b" in said
    need = float(said.split("needs about ")[1].split(" GiB")[0])
    assert 13.5 < need < 20  # 13.5 GB of bf16 weights plus KV cache and headroom
    with pytest.raises(SpecbenchError, match="--dtype bfloat16"):
        load_model("random:llama2-7b", "float32", "cpu")
    assert from_config_devices and all(device == "meta" for device, _ in from_config_devices)


def test_profile_refuses_with_exit_2_and_no_traceback(monkeypatch):
    monkeypatch.setattr(fit, "free_memory_bytes", lambda device: 2 * 2**30)
    res = CliRunner().invoke(app, ["profile", "--model", "random:llama2-7b", "--dtype", "bfloat16"])
    assert res.exit_code == 2, res.output
    assert "needs about" in res.output and "2.0 GiB" in res.output and "Traceback" not in res.output


def test_random_weights_are_built_in_the_requested_dtype(from_config_devices):
    f32 = load_model("random:tiny", "float32", "cpu")
    bf16 = load_model("random:tiny", "bfloat16", "cpu")
    built = [dtype for device, dtype in from_config_devices if device != "meta"]
    assert built == [torch.float32, torch.bfloat16]  # never float32 first, then cast
    for (name, a), b in zip(f32.model.state_dict().items(), bf16.model.state_dict().values()):
        assert torch.equal(a.to(torch.bfloat16), b), name  # the same random model, rounded
    assert f32.fingerprint() == bf16.fingerprint()


def test_memory_need_counts_weights_and_kv():
    cfg = models.model_config("random:llama2-7b")
    params, need = fit.memory_need(cfg, torch.bfloat16, torch.device("cpu"))
    assert 6.7e9 < params < 6.8e9
    kv = 2 * 32 * 4096 * fit.KV_HEADROOM_TOKENS * 2
    assert need == params * 2 + kv + fit.RUNTIME_HEADROOM
    free = fit.free_memory_bytes(torch.device("cpu"))
    assert free is None or free > 0


def test_batches_are_lossless_past_the_window(sliding):
    """Batch > 1 past the window: both engines mask each layer by its own window (hybrids included)."""
    from specbench.methods.batch_loop import generate_batch

    prompts = [prompt_ids(seed, length=20 + 4 * seed) for seed in range(3)]  # 50-68 tokens, far past 16
    reference = [build("ar", sliding).generate(p, 30, Sampling(), None).tokens for p in prompts]
    for name in ("ar", "pld", "sd", "ppd"):
        for mode in ("unpadded", "padded"):
            gens, _ = generate_batch(build(name, sliding), prompts, 2, mode, True, 30, Sampling(), [None] * 3)
            assert [g.tokens for g in gens] == reference, (name, mode)

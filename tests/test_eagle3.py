"""eagle3: the training-time test's unrolled forward matches the drafter's cached drafting along a path, greedy
decoding equals ar's tokens (static trees, chains, EAGLE-2's dynamic tree, batched), T > 0 keeps the target's
distribution, the published EAGLE-3 layout loads (safetensors and pytorch_model.bin, reduced draft vocabulary)
and other folders are refused by name, and the trainer runs. Tiny random-weight models."""

from __future__ import annotations

import json

import pytest
import torch

from specbench.core.batch.cache import new_cache
from specbench.core.verify import Sampling
from specbench.errors import SpecbenchError
from specbench.methods import get_method
from specbench.methods.eagle3 import artifact as e3
from specbench.methods.eagle3.drafter import initial
from specbench.methods.eagle3.training import Eagle3Config, train, unrolled

from .conftest import eagle3_artifact, prompt_ids


def _ar(target, ids, n):
    return get_method("ar")(target).generate(ids, n, Sampling(), None).tokens


def test_unrolled_training_matches_cached_drafting(deep):
    """Step k of the training-time test at position t equals drafting a chain from t with the drafter's KV cache:
    the pairs 0..t, then each depth's (previous output, next token) at position t + k."""
    torch.manual_seed(0)
    d = initial(deep.model, torch.arange(deep.vocab_size))
    with torch.no_grad():
        for p in d.parameters():
            p.add_(0.05 * torch.randn_like(p))
        g, ids = torch.randn(14, 3 * 64), torch.randint(0, 256, (15,))
        cols = [3, 7, 10]
        steps = unrolled(d, g, ids, cols, 4)
        assert [len(at) for at, _ in steps] == [14, 3, 3, 3]
        for t in cols:
            cache = new_cache(d)
            o = d.run(d.fuse(g[: t + 1], ids[1: t + 2])[None], torch.arange(t + 1)[None], cache)[-1:]
            assert torch.allclose(steps[0][1][t], o[0], atol=1e-5)
            for k in range(1, 4):
                o = d.run(d.fuse(o, ids[t + 1 + k: t + 2 + k])[None], torch.tensor([[t + k]]), cache)
                at, out = steps[k]
                assert torch.allclose(out[at.index(t)], o[0], atol=1e-5), (t, k)


@pytest.mark.parametrize("options", [{"tree": "size=1"}, {"tree": "size=6"}, {"tree": "size=16"}, {"gamma": 4},
                                     {"tree": "dynamic=8"}])
def test_greedy_equals_ar(deep, tmp_path, options):
    art = eagle3_artifact(deep, tmp_path / "e3", draft_tokens=200)
    method = get_method("eagle3")(deep, {"artifact": str(art), **options})
    for seed in range(3):
        ids = prompt_ids(seed)
        gen = method.generate(ids, 40, Sampling(), None)
        assert gen.tokens == _ar(deep, ids, 40), f"{options} prompt {seed}"
        assert sum(gen.accepted_lengths) == len(gen.tokens) and gen.draft_forwards > 0


def test_batched_equals_ar(deep, tmp_path):
    """B > 1 in both batch engines: each sample's tokens are its ar tokens (the fused states found per sample)."""
    from specbench.methods.batch_loop import generate_batch

    art = eagle3_artifact(deep, tmp_path / "e3")
    prompts = [prompt_ids(s, length=10 + 3 * s) for s in range(4)]
    want = [_ar(deep, p, 24) for p in prompts]
    for mode in ("unpadded", "padded"):
        for tree in ("size=6", "size=16"):
            method = get_method("eagle3")(deep, {"artifact": str(art), "tree": tree})
            gens, _ = generate_batch(method, prompts, 3, mode, True, 24, Sampling(), [None] * 4)
            assert [g.tokens for g in gens] == want, (mode, tree)


def test_oracle_path_is_accepted_deep(deep, tmp_path):
    """The fused states found per step keep the caches right through long accepted paths: with ar's tokens forced
    into the drafted chain, every step accepts the whole chain."""

    class Oracle(get_method("eagle3").guesser_type.proposer_type):
        method = None

        def draft_static(self, batch, samples, states, tree, sampling):
            drafted = super().draft_static(batch, samples, states, tree, sampling)
            m, s, tokens = self.method, samples[0], drafted[0].tokens
            at = batch.lengths[s.slot] - m.prompt_len
            assert m.reference[at] == s.history[-1]
            chain = m.reference[at + 1: at + tree.nodes]
            tokens[1:1 + len(chain)] = torch.tensor(chain)
            return drafted

    class OracleMethod(get_method("eagle3")):
        name = "eagle3-oracle-test"
        proposer_type = Oracle

    ids = prompt_ids(4)
    m = OracleMethod(deep, {"artifact": str(eagle3_artifact(deep, tmp_path / "e3")), "gamma": 4})
    m.proposer.method = m
    m.reference, m.prompt_len = _ar(deep, ids, 60), ids.shape[1]
    gen = m.generate(ids, 40, Sampling(), None)
    assert gen.tokens == m.reference[:40] and max(gen.accepted_lengths) == 5


def test_sampling_preserves_target_distribution(tiny, tmp_path):
    from .test_sd import check_distribution

    art = eagle3_artifact(tiny, tmp_path / "e3", scale=0.3)
    method = get_method("eagle3")(tiny, {"artifact": str(art), "tree": "size=6"})
    assert check_distribution(method, tiny, trials=800) < 0.1


def _published(target, folder, bin_file=False, draft=32):
    """A folder as the EAGLE repository publishes an EAGLE-3 drafter: config.json and model.safetensors (or
    pytorch_model.bin) with fc, midlayer.*, norm, lm_head over a reduced draft vocabulary, d2t and t2d; no
    specbench metadata."""
    torch.manual_seed(1)
    h, v = target.model.config.hidden_size, target.vocab_size
    used = torch.randperm(v)[:draft].sort().values  # the draft vocabulary's target ids
    i = 2 * h
    kv = target.model.config.num_key_value_heads * (h // target.model.config.num_attention_heads)
    state = {"fc.weight": torch.randn(h, 3 * h) * 0.05,
             "midlayer.self_attn.q_proj.weight": torch.randn(h, i) * 0.05,
             "midlayer.self_attn.k_proj.weight": torch.randn(kv, i) * 0.05,
             "midlayer.self_attn.v_proj.weight": torch.randn(kv, i) * 0.05,
             "midlayer.self_attn.o_proj.weight": torch.randn(h, h) * 0.05,
             "midlayer.mlp.gate_proj.weight": torch.randn(96, h) * 0.05,
             "midlayer.mlp.up_proj.weight": torch.randn(96, h) * 0.05,
             "midlayer.mlp.down_proj.weight": torch.randn(h, 96) * 0.05,
             "midlayer.hidden_norm.weight": torch.ones(h), "midlayer.input_layernorm.weight": torch.ones(h),
             "midlayer.post_attention_layernorm.weight": torch.ones(h), "norm.weight": torch.ones(h),
             "lm_head.weight": torch.randn(draft, h) * 0.05,
             "d2t": used - torch.arange(draft), "t2d": torch.zeros(v, dtype=torch.bool).index_fill(0, used, True)}
    folder.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": h, "intermediate_size": 96,
              "num_attention_heads": target.model.config.num_attention_heads,
              "num_key_value_heads": target.model.config.num_key_value_heads, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "max_position_embeddings": 512, "vocab_size": v, "draft_vocab_size": draft,
              "num_hidden_layers": 1, "torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(config))
    if bin_file:
        torch.save(state, folder / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file(state, str(folder / "model.safetensors"))
    return folder, used


@pytest.mark.parametrize("bin_file", [False, True])
def test_published_layout_loads_and_decodes(deep, tmp_path, bin_file):
    folder, used = _published(deep, tmp_path / "released", bin_file)
    art = e3.load(folder, deep)
    d = art.drafter
    assert d.lm_head.out_features == 32 and d.vocab_ids.tolist() == used.tolist()
    assert d.midlayer.self_attn.q_proj.weight.shape == (64, 128) and d.fc.in_features == 3 * 64
    o = torch.randn(5, 64)
    top = d.top_ids(o, 3)
    assert set(top.flatten().tolist()) <= set(used.tolist())  # drafts only draft-vocabulary tokens, as target ids
    assert torch.isinf(d.logits(o)[:, [t for t in range(deep.vocab_size) if t not in set(used.tolist())]]).all()
    method = get_method("eagle3")(deep, {"artifact": str(folder), "tree": "size=6"})
    ids = prompt_ids(2)
    assert method.generate(ids, 30, Sampling(), None).tokens == _ar(deep, ids, 30)


def test_other_folders_are_refused_by_name(deep, tiny, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SpecbenchError, match=r"not an EAGLE-3 drafter folder; expected config\.json and "
                                             r"model\.safetensors or pytorch_model\.bin"):
        e3.load(empty, deep)
    folder, _ = _published(deep, tmp_path / "released")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 300}))
    with pytest.raises(SpecbenchError, match="vocabulary 300, not for random:tiny"):
        e3.load(folder, tiny)
    (folder / "config.json").write_text(json.dumps(config))
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    del state["fc.weight"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(SpecbenchError, match="lack fc.weight"):
        e3.load(folder, deep)
    with pytest.raises(SpecbenchError, match="specbench train eagle3 --model"):
        get_method("eagle3")(deep, {})


def test_training_runs(deep, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the self-distillation cache
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Count {i} {i + 1} {i + 2} now."}) + "\n" for i in range(6)))
    out = train(Eagle3Config(model=deep.spec, data=str(data), prompts=4, held_out=1, new_tokens=12, dtype="float32",
                             device="cpu", vocab_top=40, sequences=2, columns=6, ttt_steps=3, steps=3,
                             out=tmp_path / "e3"))
    art = e3.load(out, deep)
    assert art.meta["steps"] == 3 and len(art.meta["top1_agreement_train_sample"]) == 3
    assert art.drafter.lm_head.out_features == 40 and (out / "config.json").is_file()
    assert art.meta["final_loss"] < art.meta["initial_loss"] * 10  # finite, not diverged
    with pytest.raises(SpecbenchError, match="--ttt-steps"):
        train(Eagle3Config(model=deep.spec, ttt_steps=0))

    # a second sitting (--init) on other prompts: the first sitting's weights and draft vocabulary, its updates counted
    other = tmp_path / "q.jsonl"
    other.write_text("".join(json.dumps({"instruction": f"Spell {i} {i * 7} backwards."}) + "\n" for i in range(6)))
    again = dict(model=deep.spec, data=str(other), prompts=4, held_out=1, new_tokens=12, dtype="float32", device="cpu",
                 sequences=2, columns=6, ttt_steps=3, steps=2, init=str(out))
    second = e3.load(train(Eagle3Config(**again, vocab_top=40, out=tmp_path / "e3b")), deep)
    assert torch.equal(second.drafter.vocab_ids.cpu(), art.drafter.vocab_ids.cpu())
    assert second.meta["steps_total"] == 5 and str(out) in second.meta["init_from"]
    assert "top1_agreement_at_start" in second.meta and "top1_agreement_untrained" not in second.meta
    assert not torch.equal(second.drafter.fc.weight, art.drafter.fc.weight)  # trained on from there
    with pytest.raises(SpecbenchError, match="--vocab-top 40"):
        train(Eagle3Config(**again, vocab_top=64, out=tmp_path / "e3c"))


def test_estimate_scores_the_drafter_per_depth(deep, tmp_path):
    """estimate's scorer: ranks [positions, 6 depths] along the true path, the depths past the sequence's end marked
    -1, and the drafter's forward time for build-tree."""
    from specbench.methods.eagle3.guesser import Eagle3Drafts

    art = eagle3_artifact(deep, tmp_path / "e3", scale=0.0)
    scorer = Eagle3Drafts.scorer(deep, str(art))
    ids = prompt_ids(3)[0].tolist()
    ranks = scorer.ranks(ids, 10)
    assert scorer.rows == 6 and ranks.shape == (len(ids) - 12, 6)
    assert (ranks[-1, 1:] == -1).all() and (ranks[:, 0] >= 0).all()
    assert scorer.extra["draft_forward_ms"] > 0

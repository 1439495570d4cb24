"""eagle and parallelspec (issue 14): the feature drafter's parallel-group layout matches its own inference path,
both methods are lossless against ar (trees, chains, several sizes), keep the target's distribution at T > 0
(Algorithm 1), the trainers run and resume, estimate / build-tree / run work end to end, and bad inputs are refused.
Tiny random-weight models."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.batch.cache import new_cache
from specbench.core.machine.hardware import hardware_slug
from specbench.core.model.load import load_model
from specbench.core.verify import Sampling
from specbench.methods.eagle import artifact as fd
from specbench.methods.eagle.training import FeatureConfig, group_forward, train
from specbench.errors import SpecbenchError
from specbench.methods import get_method

from .conftest import FOUR_LAYERS, feature_artifact, prompt_ids


def _ar(target, ids, n):
    return get_method("ar")(target).generate(ids, n, Sampling(), None).tokens


def test_group_layout_hides_other_groups_masks():
    pos, vis = fd.group_layout(5, [1, 3], 2)
    assert pos.tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5]
    assert not vis[:5, 5:].any()  # real inputs never see a mask
    assert vis[5, :2].all() and not vis[5, 2:5].any() and vis[5, 5] and not vis[5, 6]
    assert vis[6, 5] and vis[6, 6] and not vis[6, 7:].any()
    assert vis[7, :4].all() and not vis[7, 5:7].any() and vis[7, 7]  # group 2 does not see group 1's masks


def test_group_training_matches_cached_inference(deep):
    """A parallel group's outputs in one training forward equal what drafting computes with a KV cache: the pairs
    up to the point, then the k masks (ParallelSpec's training-inference match)."""
    torch.manual_seed(0)
    d = fd.FeatureDrafter(deep.model, 3)
    with torch.no_grad():
        d.masks.normal_(std=0.5)
        feats, toks = torch.randn(12, 64), torch.randint(0, 256, (12,))
        pairs = d.fuse(feats, toks)
        points = [2, 6, 8]
        pair_out, group_out = group_forward(d, pairs, points, d.masks[None].expand(3, 3, -1))
        assert torch.allclose(pair_out, d.run(pairs[None], torch.arange(12)[None]), atol=1e-5)
        for g, i in enumerate(points):
            cache = new_cache(d)
            d.run(pairs[None, : i + 1], torch.arange(i + 1)[None], cache)
            masks = d.run(d.masks[None], torch.arange(i + 1, i + 4)[None], cache)
            assert torch.allclose(group_out[g], masks, atol=1e-5)


def test_restricted_head_logits_keep_leading_dims(deep):
    """A drafter restricted to --vocab-top tokens gives the same logits per row whether the features come as [n, H]
    (a proposer) or [B, n, H] (a batch engine's step, the compiled static step included), -inf off its tokens."""
    torch.manual_seed(0)
    vocab = deep.model.config.vocab_size
    d = fd.FeatureDrafter(deep.model, 0, torch.tensor([3, 7, 11, 200])).eval()
    feats = torch.randn(5, deep.model.config.hidden_size)
    with torch.no_grad():
        flat, batched = d.logits(feats), d.logits(feats[None])
    assert flat.shape == (5, vocab) and batched.shape == (1, 5, vocab)
    assert torch.equal(batched[0], flat)
    assert torch.isinf(flat[:, 4]).all() and torch.isfinite(flat[:, [3, 7, 11, 200]]).all()


@pytest.mark.parametrize("name,options", [("eagle", {"tree": "size=1"}), ("eagle", {"tree": "size=6"}),
                                          ("eagle", {"tree": "size=16"}), ("eagle", {"gamma": 4}),
                                          ("parallelspec", {"tree": "size=2"}), ("parallelspec", {"tree": "size=10"})])
def test_greedy_equals_ar(deep, tmp_path, name, options):
    art = feature_artifact(deep, tmp_path / name, name, 3 if name == "parallelspec" else 0)
    method = get_method(name)(deep, {"artifact": str(art), **options})
    for seed in range(3):
        ids = prompt_ids(seed)
        gen = method.generate(ids, 40, Sampling(), None)
        assert gen.tokens == _ar(deep, ids, 40), f"{name} {options} prompt {seed}"
        assert sum(gen.accepted_lengths) == len(gen.tokens)
        assert gen.draft_forwards >= gen.target_forwards - 1 and gen.draft_s > 0
        if name == "parallelspec":  # one drafter forward per step
            assert gen.draft_forwards == gen.target_forwards - 1


def test_eagle_tree_drafts_one_forward_per_inner_depth(deep, tmp_path):
    art = feature_artifact(deep, tmp_path / "e")
    method = get_method("eagle")(deep, {"artifact": str(art), "gamma": 3})
    gen = method.generate(prompt_ids(1), 30, Sampling(), None)
    steps = gen.target_forwards - 1
    assert gen.draft_forwards == 3 * steps and gen.drafted == 3 * steps


class EagleOracleDrafts(get_method("eagle").guesser_type.proposer_type):
    """eagle's drafter whose chain is ar's next tokens (the drafter still runs, its guesses are replaced)."""

    oracle: "EagleOracle"  # the test's method: the reference tokens

    def draft_static(self, batch, samples, states, tree, sampling):
        drafted = super().draft_static(batch, samples, states, tree, sampling)
        oracle, s, tokens = self.oracle, samples[0], drafted[0].tokens
        at = batch.lengths[s.slot] - oracle.prompt_len  # the drafter's committed pairs end with the root's
        assert oracle.reference[at] == s.history[-1]
        chain = oracle.reference[at + 1: at + tree.nodes]
        tokens[1:1 + len(chain)] = torch.tensor(chain)
        return drafted


class EagleOracle(get_method("eagle")):
    """eagle whose chain is ar's next tokens: deep accepted paths exercise the drafter's and the target's cache
    bookkeeping."""

    name = "eagle-oracle-test"
    proposer_type = EagleOracleDrafts
    reference: list[int] = []
    prompt_len = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.proposer.oracle = self


def test_oracle_drafts_are_accepted_deep(deep, tmp_path):
    ids = prompt_ids(4)
    oracle = EagleOracle(deep, {"artifact": str(feature_artifact(deep, tmp_path / "e")), "gamma": 4})
    oracle.reference, oracle.prompt_len = _ar(deep, ids, 60), ids.shape[1]
    gen = oracle.generate(ids, 40, Sampling(), None)
    assert gen.tokens == oracle.reference[:40]
    assert max(gen.accepted_lengths) == 5 and gen.target_forwards <= 10


@pytest.mark.parametrize("name", ["eagle", "parallelspec"])
def test_sampling_preserves_target_distribution(tiny, tmp_path, name):
    """T > 0: drafts sampled from q, accepted by Algorithm 1 (residual (p - q)+): the target's distribution."""
    from .test_sd import check_distribution

    art = feature_artifact(tiny, tmp_path / name, name, 2 if name == "parallelspec" else 0, scale=0.3)
    method = get_method(name)(tiny, {"artifact": str(art), "tree": "size=6"})
    assert check_distribution(method, tiny, trials=800) < 0.1


def test_bad_inputs(deep, tiny, tmp_path):
    art = feature_artifact(deep, tmp_path / "ps", "parallelspec", 2)
    with pytest.raises(SpecbenchError, match=r"trained for .*four.*not for random:tiny"):
        fd.load(art, tiny, "parallelspec")
    with pytest.raises(SpecbenchError, match="at most 3 deep"):  # a chain of 5 needs depth 5 > k + 1
        get_method("parallelspec")(deep, {"artifact": str(art), "tree": _chain_file(tmp_path, 5)})
    e_art = feature_artifact(deep, tmp_path / "e")
    with pytest.raises(SpecbenchError, match="not both"):
        get_method("eagle")(deep, {"artifact": str(e_art), "gamma": 3, "tree": "size=4"})
    with pytest.raises(SpecbenchError, match="specbench train eagle --model"):
        get_method("eagle")(deep, {})
    meta = yaml.safe_load((art / "parallelspec.yaml").read_text())
    (art / "parallelspec.yaml").write_text(yaml.safe_dump({**meta, "mask_tokens": 0}))
    with pytest.raises(SpecbenchError, match="mask_tokens"):
        fd.load(art, deep, "parallelspec")
    with pytest.raises(SpecbenchError, match="--mask-tokens must be at least 1"):
        train(FeatureConfig(method="parallelspec", mask_tokens=0, model=deep.spec))
    with pytest.raises(SpecbenchError, match="unknown source|no-such-set"):
        train(FeatureConfig(method="eagle", data="no-such-set", model=deep.spec))


def _chain_file(tmp_path, depth: int) -> str:
    from specbench.core.tree_file import TreeFile

    path = tmp_path / f"chain{depth}.yaml"
    TreeFile({0: [((0,) * d, 0) for d in range(1, depth + 1)]}, 0, method="parallelspec").write(path)
    return str(path)


def test_training_runs_and_resumes(deep, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the self-distillation cache
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Count {i} {i + 1} {i + 2} now."}) + "\n" for i in range(6)))
    common = dict(model=deep.spec, data=str(data), prompts=4, held_out=1, new_tokens=12, dtype="float32",
                  device="cpu", vocab_top=None, sequences=2, kl_rows=8)
    out = train(FeatureConfig(method="eagle", **common, steps=4, save_every=2, out=tmp_path / "e"))
    art = fd.load(out, deep, "eagle")
    assert art.meta["steps"] == 4 and (out / "loss.png").is_file() and art.drafter.mask_tokens == 0
    assert art.meta["hardware_key"] == hardware_slug(torch.device("cpu"))  # whose times train_seconds are
    out = train(FeatureConfig(method="eagle", **common, steps=6, save_every=2, out=tmp_path / "e", resume=True))
    assert fd.load(out, deep, "eagle").meta["steps"] == 6
    out = train(FeatureConfig(method="parallelspec", **common, mask_tokens=2, groups=3, steps=3, save_every=3,
                              init=str(tmp_path / "e"), out=tmp_path / "p"))
    ps = fd.load(out, deep, "parallelspec")
    assert ps.drafter.mask_tokens == 2 and ps.drafter.masks.abs().sum() > 0
    assert ps.meta["init_from"] == str(tmp_path / "e") and len(ps.meta["top1_agreement_train_sample"]) == 3
    assert ps.meta["steps_total"] == 6 + 3  # the eagle drafter's steps, then its own


def test_a_drafter_goes_on_training_from_its_own_artefact(deep, tmp_path, monkeypatch):
    """--init of eagle (an eagle drafter) and of parallelspec (a parallelspec drafter with the same k: masks kept)
    starts a second sitting from those weights and counts the steps of both; another k is refused."""
    monkeypatch.setenv("HOME", str(tmp_path))
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Name {i} and {i + 3} twice."}) + "\n" for i in range(5)))
    common = dict(model=deep.spec, data=str(data), prompts=4, held_out=1, new_tokens=10, dtype="float32",
                  device="cpu", sequences=2, kl_rows=8, vocab_top=None)
    first = fd.load(train(FeatureConfig(method="eagle", **common, steps=2, lr=0.05, out=tmp_path / "e")), deep,
                    "eagle")  # a large step: its weights lie far from a fresh drafter's
    assert first.meta["init_from"] == "the target's last layer" and first.meta["steps_total"] == 2
    assert "top1_agreement_untrained" in first.meta  # fresh: its start was untrained
    more = fd.load(train(FeatureConfig(method="eagle", **common, steps=1, lr=1e-9, init=str(tmp_path / "e"),
                                       out=tmp_path / "e2")), deep, "eagle")
    assert more.meta["init_from"] == str(tmp_path / "e") and more.meta["steps_total"] == 3
    assert "top1_agreement_untrained" not in more.meta and len(more.meta["top1_agreement_at_start"]) == 1

    def same(a, b):
        return torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-4)  # bfloat16 storage rounds

    assert same(more.drafter.fc.weight, first.drafter.fc.weight)
    fresh = fd.FeatureDrafter(deep.model, 0, None)
    assert not same(fresh.fc.weight, first.drafter.fc.weight)
    ps = dict(common, method="parallelspec", mask_tokens=2, groups=2)
    one = fd.load(train(FeatureConfig(**ps, steps=2, lr=0.05, init=str(tmp_path / "e"), out=tmp_path / "p")), deep,
                  "parallelspec")
    two = fd.load(train(FeatureConfig(**ps, steps=1, init=str(tmp_path / "p"), out=tmp_path / "p2", lr=1e-9)),
                  deep, "parallelspec")
    assert two.meta["steps_total"] == 2 + 2 + 1 and one.drafter.masks.abs().max() > 1e-2
    assert same(two.drafter.masks, one.drafter.masks)  # kept, not zeroed
    with pytest.raises(SpecbenchError, match="2 masks.*--mask-tokens 3"):
        train(FeatureConfig(**dict(ps, mask_tokens=3), steps=1, init=str(tmp_path / "p"), out=tmp_path / "p3"))


def test_cli_estimate_build_tree_and_run(tmp_path, monkeypatch):
    """estimate measures per-depth accuracy and the drafter's forward time; build-tree --method chooses a tree with
    the drafter's cost added; run finds it by itself, stays lossless and records drafting cost."""
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "four.json"
    cfg.write_text(json.dumps(FOUR_LAYERS))
    spec = f"random:{cfg}"
    target = load_model(spec, dtype="float32", device="cpu")
    feature_artifact(target, tmp_path / "artifacts" / "four" / "eagle")
    feature_artifact(target, tmp_path / "artifacts" / "four" / "parallelspec", "parallelspec", 3)
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Say {i} {i} {i} again."}) + "\n" for i in range(3)))
    runner = CliRunner()
    for method, rows in (("eagle", 6), ("parallelspec", 4)):
        res = runner.invoke(app, ["estimate", "--method", method, "--model", spec, "--limit", "2",
                                  "--new-tokens", "12", "--data-file", str(data)])
        assert res.exit_code == 0, res.output
        acc = yaml.safe_load((tmp_path / "acceptance" / "four" / f"{method}.yaml").read_text())
        assert len(acc["per_rank"]) == rows and acc["draft_forward_ms"] > 0
        assert acc["draft_forward_hardware"] == hardware_slug(torch.device("cpu"))  # where it was timed
        res = runner.invoke(app, ["build-tree", "--method", method, "--model", spec, "--gpu", "a100",
                                  "--max-size", "20"])
        assert res.exit_code == 0, res.output
        tree = yaml.safe_load((tmp_path / "trees" / "four" / f"{method}-a100-bfloat16.yaml").read_text())
        assert tree["method"] == method and list(tree["states"]) == [0]
        assert "no four profile to scale it by" in tree["draft_cost"]  # timed on this CPU, priced on an A100
    res = runner.invoke(app, ["run", "--method", "eagle", "--method", "parallelspec", "--model", spec,
                              "--dataset", str(data), "--limit", "2", "--max-new-tokens", "12", "--warmup", "0",
                              "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert res.output.count("100%") >= 2  # both lossless against ar
    said = " ".join(res.output.split())
    assert said.count("eagle: tree") == 1 and said.count("parallelspec: tree") == 1  # the tree line once each
    res = runner.invoke(app, ["run", "--method", "parallelspec", "--model", spec, "--gamma", "3",
                              "--dataset", str(data), "--limit", "1", "--max-new-tokens", "8", "--warmup", "0",
                              "--out", str(tmp_path / "run2")])
    assert res.exit_code == 0, res.output
    assert "--gamma" in res.output and "ignored" in res.output


def test_the_drafters_time_moves_to_the_machine_a_tree_is_built_for(tmp_path, monkeypatch):
    """The drafter's forward time `estimate` measured on one machine is scaled by the target's 1-token forward on
    the other (their profiles) when another machine's or dtype's tree is priced; kept as is on its own machine, for
    a file that does not say where it was timed, or when that machine has no profile."""
    from specbench.planning.acceptance import draft_cost, draft_scale
    from specbench.planning.profile import LatencyProfile

    monkeypatch.chdir(tmp_path)

    def profile(hw, ms):
        prof = LatencyProfile("m", "float32", hw, "measured", [1, 8], {512: {"median_ms": [ms, 2 * ms]}})
        (tmp_path / "profiles" / hw).mkdir(parents=True)
        (tmp_path / "profiles" / hw / "m-float32.yaml").write_text(prof.to_yaml())
        return prof

    here, there = profile("cpu-here", 10.0), profile("cpu-there", 25.0)
    acc = tmp_path / "parallelspec.yaml"
    acc.write_text(yaml.safe_dump({"method": "parallelspec", "dtype": "float32", "draft_forward_ms": 2.0,
                                   "draft_forward_hardware": "cpu-here"}))
    assert draft_cost("parallelspec", acc, here)(1) == pytest.approx(2.0)
    assert draft_cost("parallelspec", acc, there)(1) == pytest.approx(5.0)  # 2 ms x 25 / 10
    assert draft_cost("eagle", acc, there)(3) == pytest.approx(15.0)  # one forward per depth
    assert draft_cost("medusa", acc, there)(3) == pytest.approx(5.0)  # medusa's heads: once a step
    assert draft_cost("hidden-transfer", acc, there) is None  # its guesses ride in the target's forward
    factor, said = draft_scale(yaml.safe_load(acc.read_text()), there)
    assert factor == pytest.approx(2.5) and "measured on cpu-here float32: scaled x2.50 to cpu-there" in said
    elsewhere = LatencyProfile("m", "bfloat16", "cpu-there", "measured", [1], {512: {"median_ms": [7.0]}})
    assert draft_cost("parallelspec", acc, elsewhere)(1) == pytest.approx(1.4)  # dtype too: 2 x 7 / 10
    acc.write_text(yaml.safe_dump({"method": "parallelspec", "dtype": "float32", "draft_forward_ms": 2.0,
                                   "draft_forward_hardware": "cpu-unprofiled"}))
    assert draft_cost("parallelspec", acc, there)(1) == pytest.approx(2.0)
    assert "no m profile to scale it by" in draft_scale(yaml.safe_load(acc.read_text()), there)[1]
    acc.write_text(yaml.safe_dump({"method": "parallelspec", "draft_forward_ms": 2.0}))  # an older file
    assert draft_cost("parallelspec", acc, there)(1) == pytest.approx(2.0)
    assert draft_scale(yaml.safe_load(acc.read_text()), there) == (1.0, None)


def test_gamma_beside_tree_methods_is_noted(capsys):
    from specbench.run.config import RunConfig
    from specbench.run.validation import validate
    from specbench.progress import console

    with console.capture() as captured:
        validate(RunConfig(methods=("sd", "parallelspec"), options={"gamma": 3}))
    text = " ".join(captured.get().split())
    assert "--gamma applies to sd; it is ignored by parallelspec" in text


def test_parallelspec_keeps_its_init_vocabulary(deep, tmp_path, monkeypatch):
    """parallelspec started from an eagle drafter takes that drafter's restricted head vocabulary (its own count
    drops replies shorter than k + 3 and may break a tie differently); a head of another size is refused."""
    monkeypatch.setenv("HOME", str(tmp_path))
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"List {i} and {i * 7} please."}) + "\n" for i in range(5)))
    common = dict(model=deep.spec, data=str(data), prompts=4, held_out=1, new_tokens=10, dtype="float32",
                  device="cpu", sequences=2, kl_rows=8, steps=1)
    eagle = fd.load(train(FeatureConfig(method="eagle", **common, vocab_top=16, out=tmp_path / "e")), deep, "eagle")
    out = train(FeatureConfig(method="parallelspec", **common, vocab_top=16, mask_tokens=2, groups=2,
                              init=str(tmp_path / "e"), out=tmp_path / "p"))
    ps = fd.load(out, deep, "parallelspec")
    assert torch.equal(ps.drafter.vocab_ids.cpu(), eagle.drafter.vocab_ids.cpu())
    with pytest.raises(SpecbenchError, match="covers 16 tokens.*asks for 8 tokens"):
        train(FeatureConfig(method="parallelspec", **common, vocab_top=8, mask_tokens=2, groups=2,
                            init=str(tmp_path / "e"), out=tmp_path / "p8"))

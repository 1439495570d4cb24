"""medusa, medusa-typical and hidden-transfer (issue 15): lossless against ar, the target's distribution at T > 0,
the transfer-layer split, the trainers, estimate / build-tree, and their bad inputs. Tiny random-weight models."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.model.load import load_model
from specbench.methods.hidden_transfer.layers import LayerTransfer, capture, check_transfer_layers, transferred
from specbench.core.verify import Sampling
from specbench.methods.medusa import artifact as mh
from specbench.methods.hidden_transfer import artifact as tp
from specbench.errors import SpecbenchError
from specbench.methods import get_method

from .conftest import FOUR_LAYERS, heads_artifact, projections_artifact, prompt_ids



def _ar(target, ids, n):
    return get_method("ar")(target).generate(ids, n, Sampling(), None).tokens


@pytest.mark.parametrize("name", ["medusa", "medusa-typical", "hidden-transfer"])
@pytest.mark.parametrize("size", [2, 5, 16])
def test_greedy_equals_ar(deep, tmp_path, name, size):
    art = (heads_artifact(deep, tmp_path / "m") if name.startswith("medusa")
           else projections_artifact(deep, tmp_path / "h"))
    method = get_method(name)(deep, {"artifact": str(art), "tree": f"size={size}"})
    for seed in range(3):
        ids = prompt_ids(seed)
        gen = method.generate(ids, 40, Sampling(), None)
        assert gen.tokens == _ar(deep, ids, 40), f"{name} size {size} prompt {seed}"
        assert sum(gen.accepted_lengths) == len(gen.tokens)


class TransferOracleGuesses(get_method("hidden-transfer").guesser_type.proposer_type):
    """Hidden Transfer's guesses with ar's token first (the real transfer forward still runs; its guesses are
    replaced after)."""

    oracle: "TransferOracle"  # the test's method, which says where the step placed the root

    def next_guesses(self, h, layout, node, all_logits=None):
        real = super().next_guesses(h, layout, node, all_logits)
        oracle = self.oracle
        fake = torch.randn_like(real)
        for j in range(real.shape[0]):
            k = oracle.past + layout.tree.depths[node] + 2 + j - oracle.prompt_len
            if k < len(oracle.reference):
                fake[j, oracle.reference[k]] = 100.0
        return fake


class TransferOracle(get_method("hidden-transfer")):
    """hidden-transfer whose guesses put ar's token first: deep accepted paths and cache compaction are exercised."""

    name = "hidden-transfer-oracle-test"
    proposer_type = TransferOracleGuesses
    reference: list[int] = []
    prompt_len = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.proposer.oracle = self

    def _placed(self, layout, past, prefix=0):  # where the step puts the root: its guesses' positions
        self.past = past + prefix


def test_oracle_guesses_are_accepted_deep(deep, tmp_path):
    ids = prompt_ids(4)
    oracle = TransferOracle(deep, {"artifact": str(projections_artifact(deep, tmp_path / "h")), "tree": "size=12"})
    oracle.reference, oracle.prompt_len = _ar(deep, ids, 60), ids.shape[1]
    gen = oracle.generate(ids, 40, Sampling(), None)
    assert gen.tokens == oracle.reference[:40]
    assert max(gen.accepted_lengths) >= 3 and gen.target_forwards < 25


def test_sampling_preserves_target_distribution(tiny, tmp_path):
    """T > 0: medusa's tree verification (multi-candidate speculative sampling) keeps the target's distribution."""
    from .test_sd import check_distribution

    medusa = get_method("medusa")(tiny, {"artifact": str(heads_artifact(tiny, tmp_path / "m", scale=0.5)),
                                         "tree": "size=8"})
    assert check_distribution(medusa, tiny, trials=800) < 0.1


def test_typical_acceptance_is_lossy_label():
    assert not get_method("medusa-typical").lossless and get_method("medusa").lossless
    assert get_method("hidden-transfer").lossless


def test_transfer_split_matches_a_manual_replacement(deep):
    """A transfer step at layer l changes only the pseudo position, from layer l on: the real positions' outputs
    are those of the plain forward (the mask hides the pseudo position), and the pseudo position's output equals
    a forward where its state entering layer l is W h of its source."""
    model = deep.model
    ids = prompt_ids(1)[0, :10]
    n = len(ids)
    emb = model.get_input_embeddings()(ids)
    x = torch.cat([emb, torch.zeros(1, emb.shape[1])])[None]  # [1, n + 1, H]: a placeholder after the tokens
    allowed = torch.ones(n + 1, n + 1).tril().bool()
    mask = torch.zeros(n + 1, n + 1).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    pos = torch.arange(n + 1)[None]
    w = torch.randn(64, 64) * 0.1
    step = LayerTransfer(2, torch.tensor([n]), torch.tensor([n - 1]), lambda h: h @ w.T)
    with torch.no_grad(), transferred(model, [step]), capture(model, [2]) as seen:  # capture after the swap
        out = model.get_decoder()(inputs_embeds=x, attention_mask=mask, position_ids=pos).last_hidden_state[0]
    plain = model.get_decoder()(inputs_embeds=emb[None]).last_hidden_state[0]
    assert torch.allclose(out[:n], plain, atol=1e-5)
    assert torch.allclose(seen[2][0, n], seen[2][0, n - 1] @ w.T, atol=1e-5)  # the replaced state entered layer 2


def test_transfer_layers_checked():
    assert check_transfer_layers([3, 5, 9], 12) == [3, 5, 9]
    for bad, words in (([0, 3], "outside"), ([3, 12], "outside"), ([5, 5], "strictly increasing"),
                       ([6, 4], "strictly increasing"), ([], "at least one")):
        with pytest.raises(SpecbenchError, match=words):
            check_transfer_layers(bad, 12)


def test_default_transfer_layers():
    """The measured choice for the embedded model; the paper's choice scaled to the depth for any other."""
    from specbench.methods.hidden_transfer.training import default_layers

    assert default_layers(30, model="smollm2-135m") == ([12, 17, 22], "measured for this model (MEASURED_LAYERS)")
    layers, why = default_layers(30, model="random:smollm2-135m")
    assert "scaled" in why
    assert default_layers(32, model="random:llama2-7b")[0] == [13, 18, 23]
    assert default_layers(4)[0] == [1, 2, 3]  # kept inside 1..L-1


def test_artifacts_for_another_model_are_refused(deep, tiny, tmp_path):
    heads_artifact(deep, tmp_path / "m")
    projections_artifact(deep, tmp_path / "h")
    with pytest.raises(SpecbenchError, match=r"trained for .*four.*not for random:tiny"):
        mh.load(tmp_path / "m", tiny)
    with pytest.raises(SpecbenchError, match=r"hidden size 64.*not for random:tiny|not for random:tiny"):
        tp.load(tmp_path / "h", tiny)


def test_missing_and_malformed_artifacts(deep, tmp_path):
    with pytest.raises(SpecbenchError, match="specbench train medusa --model"):
        get_method("medusa")(deep, {})
    with pytest.raises(SpecbenchError, match="specbench train hidden-transfer --model"):
        get_method("hidden-transfer")(deep, {})
    folder = heads_artifact(deep, tmp_path / "m")
    meta = yaml.safe_load((folder / mh.META_FILE).read_text())
    (folder / mh.META_FILE).write_text(yaml.safe_dump({**meta, "heads": "three"}))
    with pytest.raises(SpecbenchError, match=r"medusa.yaml: field `heads`"):
        mh.load(folder, deep)
    folder = projections_artifact(deep, tmp_path / "h")
    meta = yaml.safe_load((folder / tp.META_FILE).read_text())
    (folder / tp.META_FILE).write_text(yaml.safe_dump({**meta, "transfer_layers": [3, 1]}))
    with pytest.raises(SpecbenchError, match="strictly increasing"):
        tp.load(folder, deep)


def test_cli_estimate_build_tree_and_run(deep, tmp_path, monkeypatch):
    """estimate writes per-depth accuracy for medusa and hidden-transfer; build-tree --method makes their trees;
    run finds the tree by itself and stays lossless."""
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "four.json"
    cfg.write_text(json.dumps(FOUR_LAYERS))
    spec = f"random:{cfg}"
    target = load_model(spec, dtype="float32", device="cpu")
    m_art = heads_artifact(target, tmp_path / "artifacts" / "four" / "medusa")
    projections_artifact(target, tmp_path / "artifacts" / "four" / "hidden-transfer")
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Say {i} {i} {i} again."}) + "\n" for i in range(3)))
    runner = CliRunner()
    for method in ("medusa", "hidden-transfer"):
        res = runner.invoke(app, ["estimate", "--method", method, "--model", spec, "--limit", "2",
                                  "--new-tokens", "12", "--data-file", str(data)])
        assert res.exit_code == 0, res.output
        acc = yaml.safe_load((tmp_path / "acceptance" / "four" / f"{method}.yaml").read_text())
        assert len(acc["per_rank"]) == 3 and acc["method"] == method
        # medusa's heads cost time beside the target's forward; hidden-transfer's pseudo positions ride in it
        assert (acc.get("draft_forward_ms", 0) > 0) == (method == "medusa")
        assert all(a <= b for a, b in zip(acc["topk_accuracy"][0], acc["topk_accuracy"][0][1:]))
        res = runner.invoke(app, ["build-tree", "--method", method, "--model", spec, "--gpu", "a100",
                                  "--max-size", "20"])
        assert res.exit_code == 0, res.output
    tree = yaml.safe_load((tmp_path / "trees" / "four" / "medusa-a100-bfloat16.yaml").read_text())
    assert tree["method"] == "medusa" and tree["prompt_tokens"] == 0 and list(tree["states"]) == [0]
    assert "measured on" in tree["draft_cost"]  # the heads' time, taken from this CPU to the A100's prediction
    tree = yaml.safe_load((tmp_path / "trees" / "four" / "hidden-transfer-a100-bfloat16.yaml").read_text())
    assert tree["method"] == "hidden-transfer" and sorted(tree["states"]) == [1, 2, 3]
    ht_tree = tmp_path / "trees" / "four" / "hidden-transfer-a100-bfloat16.yaml"
    res = runner.invoke(app, ["run", "--method", "medusa", "--method", "hidden-transfer", "--model", spec,
                              "--tree", str(ht_tree), "--dataset", str(data), "--limit", "2",
                              "--max-new-tokens", "12", "--warmup", "0", "--out", str(tmp_path / "run")])
    assert res.exit_code != 0  # one --tree for two methods: the hidden-transfer tree is not a medusa tree
    assert "one-state tree" in res.output
    res = runner.invoke(app, ["run", "--method", "medusa", "--method", "hidden-transfer", "--model", spec,
                              "--dataset", str(data), "--limit", "2", "--max-new-tokens", "12", "--warmup", "0",
                              "--out", str(tmp_path / "run2")])
    assert res.exit_code == 0, res.output
    assert res.output.count("100%") >= 2  # both lossless against ar
    bad = runner.invoke(app, ["estimate", "--method", "ar", "--model", spec])
    assert bad.exit_code != 0 and "choose one of" in bad.output and "pld" in bad.output
    no_drafter = runner.invoke(app, ["estimate", "--method", "sd", "--model", spec])  # sd's acceptance needs a drafter
    assert no_drafter.exit_code != 0 and "--drafter" in no_drafter.output and "Traceback" not in no_drafter.output
    assert m_art.is_dir()


def test_training_runs_and_resumes(deep, tmp_path, monkeypatch):
    """Both trainers: a few steps on self-distilled data, an artefact that loads, --resume continues."""
    from specbench.methods.medusa.training import MedusaConfig
    from specbench.methods.medusa.training import train as train_medusa
    from specbench.methods.hidden_transfer.training import TransferConfig
    from specbench.methods.hidden_transfer.training import train as train_transfer

    monkeypatch.setenv("HOME", str(tmp_path))  # the self-distillation cache
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Count {i} {i + 1} {i + 2} now."}) + "\n" for i in range(6)))
    spec = deep.spec
    common = dict(model=spec, data=str(data), prompts=4, held_out=1, new_tokens=12, dtype="float32", device="cpu")
    out = train_medusa(MedusaConfig(**common, steps=4, positions=16, save_every=2, out=tmp_path / "m"))
    heads = mh.load(out, deep)
    assert heads.meta["steps"] == 4 and (out / "loss.png").is_file() and heads.heads.weight.abs().sum() > 0
    out = train_medusa(MedusaConfig(**common, steps=6, positions=16, save_every=2, out=tmp_path / "m",
                                    resume=True))
    assert mh.load(out, deep).meta["steps"] == 6
    out = train_transfer(TransferConfig(**common, transfer_layers=(1, 3), steps=3, insertions=4, save_every=3,
                                        out=tmp_path / "h"))
    proj = tp.load(out, deep)
    assert proj.meta["transfer_layers"] == [1, 3] and not torch.equal(proj.projections.weight[0], torch.eye(64))
    assert proj.meta["masked"] is False and not proj.projections.masked
    with pytest.raises(SpecbenchError, match="strictly increasing"):
        train_transfer(TransferConfig(**common, transfer_layers=(3, 1), steps=1, out=tmp_path / "x"))
    with pytest.raises(SpecbenchError, match="unknown source"):
        train_medusa(MedusaConfig(**{**common, "data": "no-such-set"}, steps=1, out=tmp_path / "y"))


def test_masked_ablation_layout(deep, tmp_path):
    """--masked (the paper's Masked ablation): a pseudo position sees the context and itself, not the earlier pseudo
    positions, so its guess no longer depends on them; such projections load for estimates but do not decode."""
    from specbench.methods.ppd import artifact as pt
    from specbench.methods.hidden_transfer.training import pseudo_forward, real_forward

    mask = pt.insertion_inputs([4, 9], 3, 1, 12, torch.float32, "cpu", see_earlier=False)[0]
    own = mask[0, 0, :, 12:] == 0  # [6, 6]: which pseudo inputs see which
    assert torch.equal(own, torch.eye(6, dtype=torch.bool))
    unmasked = pt.insertion_inputs([4, 9], 3, 1, 12, torch.float32, "cpu")[0][0, 0, :, 12:] == 0
    assert bool(unmasked[2, 0]) and not bool(own[2, 0])
    ids = list(range(3, 23))
    cache, _, captured = real_forward(deep, ids, [1, 2, 3])
    proj = tp.TransferProjections(64, [1, 2, 3], masked=True)
    with torch.no_grad():
        proj.weight.add_(0.3 * torch.randn_like(proj.weight))
        masked = pseudo_forward(deep, proj, cache, len(ids), [8], captured)  # [1, 3, H]
        proj.weight[0].mul_(-2.0)  # step 1's pseudo state changes; step 2 and 3 cannot see it
        again = pseudo_forward(deep, proj, cache, len(ids), [8], captured)
        assert torch.allclose(masked[0, 1:], again[0, 1:], atol=1e-5) and not torch.allclose(masked[0, 0], again[0, 0])
        proj.masked = False
        seeing = pseudo_forward(deep, proj, cache, len(ids), [8], captured)
        assert not torch.allclose(seeing[0, 1:], again[0, 1:], atol=1e-5)
        proj.masked = True
    folder = projections_artifact(deep, tmp_path / "masked")
    meta = yaml.safe_load((folder / tp.META_FILE).read_text())
    (folder / tp.META_FILE).write_text(yaml.safe_dump({**meta, "masked": True}))
    assert tp.load(folder, deep).projections.masked
    with pytest.raises(SpecbenchError, match="--masked"):
        get_method("hidden-transfer")(deep, {"artifact": str(folder)})
    (folder / tp.META_FILE).write_text(yaml.safe_dump({**meta, "masked": "yes"}))
    with pytest.raises(SpecbenchError, match="field `masked`"):
        tp.load(folder, deep)

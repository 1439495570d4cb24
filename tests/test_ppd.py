"""PPD decoding on the tiny model: lossless with accepted multi-token paths (an oracle makes the guesses right),
dynamic tree states, tree options, artefacts, and acceptance estimates."""

from __future__ import annotations

import pytest
import torch

from specbench.core.tree_file import TreeFile
from specbench.core.verify import Sampling
from specbench.methods.ppd import artifact as pt
from specbench.errors import SpecbenchError
from specbench.methods.ppd.scoring import score_sequence
from specbench.planning.acceptance import read_per_rank
from specbench.methods import get_method
from specbench.methods.ppd.guesser import ParallelPromptDecoding
from specbench.methods.tree.proposer import Proposer

from .conftest import prompt_ids


class OracleGuesses(Proposer):
    """PPD's proposer whose guesses put the true `ar` token at the oracle method's `rank` (the real guesses are
    still computed, for their shape)."""

    oracle: "Oracle"  # the test's method, which says where the step placed the root

    def next_guesses(self, h, layout, node, all_logits=None):
        real = super().next_guesses(h, layout, node, all_logits)  # [c, V] (shape and the real computation)
        oracle = self.oracle
        node_pos = oracle.past + layout.tree.depths[node]
        fake = torch.randn_like(real)
        for j in range(real.shape[0]):
            k = node_pos + 2 + j - oracle.prompt_len  # index into the reference of the token guessed
            if k < len(oracle.reference):
                fake[j, oracle.reference[k]] = 100.0 if oracle.rank == 0 else 50.0
                if oracle.rank == 1:
                    fake[j, (oracle.reference[k] + 1) % fake.shape[1]] = 100.0
        return fake


class Oracle(ParallelPromptDecoding):
    """PPD whose prompt-token guesses put the true `ar` token at rank `rank` (rank 0 unless told otherwise):
    exercises accepted paths deeper than one, sibling choice and cache compaction."""

    name = "ppd-oracle-test"  # not registered
    proposer_type = OracleGuesses
    reference: list[int] = []
    prompt_len = 0
    rank = 1

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.proposer.oracle = self

    def _placed(self, layout, past, prefix=0):  # where the step puts the root: its guesses' positions
        self.past = past + prefix


def _ar(tiny, ids, n):
    return get_method("ar")(tiny, {}).generate(ids, n, Sampling(), None).tokens


SECOND_RANK = [((0,), 3), ((1,), 3), ((1, 0), 3), ((1, 1), 3), ((1, 1, 0), 3), ((1, 1, 1), 3)]


@pytest.mark.parametrize("rank, tree", [(0, "size=12"), (0, "size=40"), (1, SECOND_RANK)])
def test_greedy_equals_ar_when_guesses_are_accepted(tiny, tmp_path, rank, tree):
    ids = prompt_ids(4)
    ref = _ar(tiny, ids, 40)
    if not isinstance(tree, str):  # the true token is the second guess: the tree must hold rank-1 paths
        TreeFile({k: [(p, c) for p, c in tree if len(p) <= k] for k in (1, 2, 3)}, 3).write(tmp_path / "t.yaml")
        tree = str(tmp_path / "t.yaml")
    method = Oracle(tiny, {"artifact": "untrained", "tree": tree})
    method.reference, method.prompt_len, method.rank = ref, ids.shape[1], rank
    gen = method.generate(ids, 40, Sampling(), None)
    assert gen.tokens == ref
    assert gen.target_forwards < len(ref) / 2, "right guesses must be accepted several at a time"
    assert max(gen.accepted_lengths) >= 3


def test_dynamic_states_follow_the_accepted_node(tiny):
    """A tree whose nodes carry 1..m prompt tokens: each state's tree is used and output stays exact."""
    # with right top-1 guesses the deepest node is accepted: state 3 -> 1 -> 2 -> 3 -> ...
    states = {1: [((0,), 2), ((1,), 1)], 2: [((0,), 2), ((1,), 1), ((0, 0), 3)],
              3: [((0,), 3), ((1,), 1), ((0, 0), 2), ((0, 0, 0), 1)]}
    ids = prompt_ids(5)
    ref = _ar(tiny, ids, 40)
    used = []

    class Tracking(Oracle):
        def _placed(self, layout, past, prefix=0):
            used.append(layout.tree.depth)
            super()._placed(layout, past, prefix)

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.yaml"
        TreeFile(states, 3, model="tiny").write(path)
        method = Tracking(tiny, {"artifact": "untrained", "tree": str(path)})
    method.reference, method.prompt_len, method.rank = ref, ids.shape[1], 0
    gen = method.generate(ids, 40, Sampling(), None)
    assert gen.tokens == ref
    assert {1, 2, 3} <= set(used)


def test_sampling_runs_and_is_seeded(tiny):
    ids = prompt_ids(2)
    for name in ("ppd", "ppd-typical"):
        method = get_method(name)(tiny, {"artifact": "untrained"})
        a = method.generate(ids, 20, Sampling(0.8), torch.Generator().manual_seed(1)).tokens
        b = method.generate(ids, 20, Sampling(0.8), torch.Generator().manual_seed(1)).tokens
        assert a == b and len(a) == 20
    assert get_method("ppd-typical").lossless is False and get_method("ppd").lossless is True


def test_tree_options_and_errors(tiny, tmp_path):
    with pytest.raises(SpecbenchError, match="size=N"):
        get_method("ppd")(tiny, {"artifact": "untrained", "tree": "size=x"})
    with pytest.raises(SpecbenchError, match="no such file"):
        get_method("ppd")(tiny, {"artifact": "untrained", "tree": str(tmp_path / "none.yaml")})
    with pytest.raises(SpecbenchError, match="too small"):
        get_method("ppd")(tiny, {"artifact": "untrained", "tree": "size=1"})
    big = tmp_path / "big.yaml"
    TreeFile({k: [((0,), k)] for k in range(1, 5)}, 4).write(big)
    with pytest.raises(SpecbenchError, match="artefact"):
        get_method("ppd")(tiny, {"artifact": "untrained", "tree": str(big)})
    with pytest.raises(SpecbenchError, match="not a prompt-token artefact"):
        get_method("ppd")(tiny, {"artifact": str(tmp_path)})


def test_artefact_round_trip_and_model_check(tiny, tmp_path):
    tokens = pt.untrained(tiny, 2, 2)
    tokens.meta.update(model=tiny.spec, model_key=pt.model_key(tiny))
    pt.save(tokens, tmp_path)
    back = pt.load(tmp_path, tiny)
    assert torch.equal(back.embeddings, tokens.embeddings) and back.count == 2 and back.ept == 2
    assert torch.equal(pt.load(tmp_path, tiny, initial=True).embeddings, tokens.embeddings)
    (tmp_path / pt.META_FILE).write_text("model: other\nmodel_key: abc\n")
    with pytest.raises(SpecbenchError, match="trained for other"):
        pt.load(tmp_path, tiny)


def test_estimate_scores_against_the_true_tokens(tiny, tmp_path):
    """score_sequence: rank of the true token among each prompt token's guesses; sane shape and values."""
    tokens = pt.untrained(tiny, 3, 2)
    ids = prompt_ids(1)[0].tolist()
    ranks = score_sequence(tiny, tokens, ids, 10, chunk=7)
    assert ranks.shape == (len(ids) - 12, 3)
    assert ranks[-1, 1] == -1 and ranks[0, 2] >= 0  # no target beyond the end
    assert ((ranks >= -1) & (ranks <= 10)).all()
    path = tmp_path / "acc.yaml"
    path.write_text("per_rank: [[0.5, 0.1], [0.3, 0.1]]\n")
    assert read_per_rank(path, 2) == [[0.5, 0.1], [0.3, 0.1]]
    with pytest.raises(SpecbenchError, match="need 3"):
        read_per_rank(path, 3)


def test_estimate_and_run_commands(tmp_path):
    """`specbench estimate` writes the acceptance file and its table; `run --method ppd` on the tiny model."""
    import json

    import yaml
    from typer.testing import CliRunner

    from specbench.cli import app

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Say {i} {i} {i} again."}) + "\n" for i in range(3)))
    out = tmp_path / "acc.yaml"
    res = CliRunner().invoke(app, ["estimate", "--model", "random:tiny", "--artifact", "untrained", "--limit", "2",
                                   "--new-tokens", "12", "--data-file", str(data), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "@1" in res.output and "top-5" in res.output
    acc = yaml.safe_load(out.read_text())
    assert len(acc["per_rank"]) == 3 and len(acc["topk_accuracy"][0]) == 10 and acc["prompts"] == 2
    assert all(a <= b for a, b in zip(acc["topk_accuracy"][0], acc["topk_accuracy"][0][1:]))
    res = CliRunner().invoke(app, ["run", "--method", "ppd", "--model", "random:tiny", "--artifact", "untrained",
                                   "--dataset", str(data), "--limit", "2", "--max-new-tokens", "16", "--warmup", "0",
                                   "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert "ppd" in res.output and "100%" in res.output  # lossless against ar
    bad = CliRunner().invoke(app, ["estimate", "--method", "ar", "--model", "random:tiny"])  # nothing to estimate
    assert bad.exit_code != 0 and "choose one of" in bad.output


def test_ppd_sampling_preserves_target_distribution(tiny):
    """T > 0: ppd's multi-candidate tree verification keeps the target's distribution (2-token continuations),
    with guesses that are often right (the oracle puts ar's greedy tokens among the candidates)."""
    from .test_sd import check_distribution

    ids = prompt_ids(0)[:, :20]
    oracle = Oracle(tiny, {"artifact": "untrained", "tree": "size=12"})
    oracle.reference, oracle.prompt_len, oracle.rank = _ar(tiny, ids, 8), ids.shape[1], 0
    distance = check_distribution(oracle, tiny, trials=800)
    assert distance < 0.1, f"TV {distance:.3f} between ppd samples and the target distribution"


def test_tree_size_sweep_reports_measured_and_predicted(tmp_path):
    """`run --tree-sizes` labels each size, and the report compares measured with predicted tau per size."""
    import json

    import pandas as pd
    from typer.testing import CliRunner

    from specbench.cli import app

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Say {i} {i} {i} again."}) + "\n" for i in range(2)))
    out = tmp_path / "sweep"
    res = CliRunner().invoke(app, ["run", "--method", "ppd", "--model", "random:tiny", "--artifact", "untrained",
                                   "--tree-sizes", "4,10", "--dataset", str(data), "--limit", "2",
                                   "--max-new-tokens", "12", "--warmup", "0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    sizes = pd.read_csv(out / "tree_sizes.csv")
    assert list(sizes["method"]) == ["ppd@4", "ppd@10"] and list(sizes["size"]) == [4, 10]
    assert (sizes["predicted_tau"] > 1).all() and (sizes["tau"] >= 1).all()
    assert (out / "tree_sizes.png").is_file() and "measured vs predicted" in (out / "report.md").read_text()

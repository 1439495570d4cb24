"""Held-out top-1 per draft position (`specbench train eval`, and every tree method's train command when it ends):
estimate's scoring on the held-out prompts of the training sources, written into the artefact's metadata."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.cli.train_eval import evaluate
from specbench.errors import SpecbenchError
from tests.conftest import FOUR_LAYERS, feature_artifact, heads_artifact, projections_artifact


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"instruction": f"Count {i} {i + 1} {i + 2} now, then {i} again."}) + "\n"
                            for i in range(7)))
    return path


def test_train_command_scores_held_out_prompts(tmp_path, data):
    """`train medusa` ends with the check on the held-out prompts (at most those held out); `train eval` repeats it
    and refuses prompts the artefact trained on."""
    cfg = tmp_path / "four.json"
    cfg.write_text(json.dumps(FOUR_LAYERS))
    spec = f"random:{cfg}"
    out = tmp_path / "m"
    res = CliRunner().invoke(app, ["train", "medusa", "--model", spec, "--data", str(data), "--prompts", "3",
                                   "--held-out", "2", "--new-tokens", "10", "--steps", "2", "--positions", "8",
                                   "--dtype", "float32", "--device", "cpu", "--out", str(out)])
    assert res.exit_code == 0, res.output
    meta = yaml.safe_load((out / "medusa.yaml").read_text())
    assert len(meta["top1_heldout"]) == 3 and all(0 <= x <= 1 for x in meta["top1_heldout"])
    assert meta["top1_heldout_by_source"] == {str(data): meta["top1_heldout"]}
    assert meta["heldout"]["prompts"].startswith("0..1 of each source") and meta["heldout"]["new_tokens"] == 64
    assert list(meta).index("top1_heldout") == list(meta).index("top1_agreement_untrained") + 1
    assert "held-out top-1 per draft position" in " ".join(res.output.split())
    again = CliRunner().invoke(app, ["train", "eval", str(out), "--model", spec, "--prompts", "2", "--new-tokens",
                                     "10", "--no-write", "--device", "cpu"])
    assert again.exit_code == 0, again.output
    bad = CliRunner().invoke(app, ["train", "eval", str(out), "--model", spec, "--prompts", "3", "--device", "cpu"])
    assert bad.exit_code != 0 and "would score prompts it trained on; use at most 2" in " ".join(bad.output.split())
    assert "Traceback" not in bad.output
    missing = CliRunner().invoke(app, ["train", "eval", str(tmp_path)])
    assert missing.exit_code != 0 and "no artefact metadata" in " ".join(missing.output.split())


def test_heldout_top1_is_estimates_top1(deep, tmp_path, data):
    """On one source, top1_heldout is the top-1 column of `estimate` on the same prompts and reply length."""
    from specbench.methods.base import tree_families
    from specbench.planning.acceptance import estimate_with

    folder = heads_artifact(deep, tmp_path / "medusa")
    result = evaluate(folder, deep.spec, "float32", "cpu", 3, 12, str(data), held_out=3)
    scorer = tree_families()["medusa"].guesser_type.scorer(deep, str(folder), False)
    est = estimate_with(deep, scorer.ranks, scorer.rows, str(data), 3, 12, None, "medusa", scorer.source)
    assert result["top1_heldout"] == [row[0] for row in est["topk_accuracy"]]
    assert result["heldout"]["positions"] == est["positions"]
    meta = yaml.safe_load((folder / "medusa.yaml").read_text())
    assert meta["top1_heldout"] == result["top1_heldout"]


@pytest.mark.parametrize("kind", ["eagle", "parallelspec", "hidden-transfer"])
def test_every_tree_artefact_is_scored_per_draft_position(deep, tmp_path, data, kind):
    folder = tmp_path / kind
    if kind == "hidden-transfer":
        projections_artifact(deep, folder)
    else:
        feature_artifact(deep, folder, kind, 3 if kind == "parallelspec" else 0)
    rows = {"eagle": 6, "parallelspec": 4, "hidden-transfer": 3}[kind]
    with pytest.raises(SpecbenchError, match="no `data` entry"):  # a metadata file without training facts
        evaluate(folder, deep.spec, "float32", "cpu", 2, 10)
    result = evaluate(folder, deep.spec, "float32", "cpu", 2, 10, str(data), held_out=2)
    assert len(result["top1_heldout"]) == rows

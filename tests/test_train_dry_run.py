"""`specbench train METHOD --dry-run`: the trainer's steps on random data, timed, with peak memory and the full
recipe's projected cost; nothing written."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specbench.cli.app import app
from specbench.train.configs import EagleConfig, MedusaConfig
from specbench.train.dry_run import DRY_SEQUENCES, recipe_class, run_dry


@pytest.mark.parametrize("cls, extra", [(MedusaConfig, {"heads": 2, "positions": 16}),
                                        (EagleConfig, {"vocab_top": None, "sequences": 2})])
def test_a_dry_run_times_the_recipes_steps_and_projects_the_full_one(cls, extra, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = cls(model="random:tiny", dtype="float32", device="cpu", new_tokens=24, prompts=30, **extra)
    result = run_dry(cls, cfg, 2)
    assert len(result.step_s) == 2 and all(t > 0 for t in result.step_s)
    assert result.per_step == result.step_s[1]  # the first step (optimiser state allocated) is not the typical one
    assert result.full_steps == {MedusaConfig: 400, EagleConfig: 1500}[cls]  # the command's default, not the 2 run
    assert result.sequences == 30 * 5  # prompts x the five sources of the default training mix
    assert result.peak_mb >= result.load_peak_mb * 0.5 > 0 and result.data_s > 0
    assert result.projected_peak_mb() >= result.peak_mb
    assert result.target == "random:tiny (float32, cpu)"
    assert not any(tmp_path.iterdir())  # no artefact, checkpoint or data cache written


def test_each_trainer_has_one_recipe():
    from specbench.train.configs import CONFIGS

    assert {recipe_class(c.trainer).__name__ for c in CONFIGS} == {
        "PPDRecipe", "DrafterRecipe", "MedusaRecipe", "TransferRecipe", "FeatureRecipe"}


def test_the_command_prints_the_measurements_and_the_projection(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["train", "medusa", "--model", "random:tiny", "--dry-run", "--steps", "2",
                                   "--dtype", "float32", "--device", "cpu", "--heads", "2", "--positions", "16",
                                   "--max-new-tokens", "24"], terminal_width=200)
    assert res.exit_code == 0, res.output
    said = res.output
    assert "train medusa --dry-run: random:tiny (float32, cpu), 2 steps on random data" in said
    for row in ("load the target", f"prepare ({DRY_SEQUENCES} sequences)", "one optimiser step",
                "400 optimiser steps", "the full recipe", "nothing was written"):
        assert row in said, row
    assert not (tmp_path / "artifacts").exists()

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
    assert len(result.update_s) == 2 and all(t > 0 for t in result.update_s)
    assert result.per_update == result.update_s[1]  # the first step (optimiser state allocated) is not the typical one
    assert result.full_steps == {MedusaConfig: 400, EagleConfig: 1500}[cls]  # the command's default, not the 2 run
    assert result.sequences == 30 * 5  # prompts x the five sources of the default training mix
    assert result.peak_mb >= result.load_peak_mb * 0.5 > 0 and result.data_s > 0
    assert result.projected_peak_mb() >= result.peak_mb
    assert result.target == "random:tiny (float32, cpu)"
    assert not any(tmp_path.iterdir())  # no artefact, checkpoint or data cache written


def test_each_trainer_has_one_recipe():
    from specbench.train.configs import CONFIGS

    assert {recipe_class(c.trainer).__name__ for c in CONFIGS} == {
        "PPDRecipe", "DrafterRecipe", "MedusaRecipe", "TransferRecipe", "FeatureRecipe", "Eagle3Recipe"}


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


def test_the_projection_counts_the_full_recipes_prompts_not_the_dry_steps(tmp_path, monkeypatch):
    """PPD's prompts per source follow --steps when --prompts is left out: the projection takes them from the full
    recipe's steps (one per step and source, at most 300), not from the dry run's few."""
    from specbench.methods.ppd.training import auto_prompts
    from specbench.train.configs import PPDConfig
    from specbench.train.dry_run import default_of

    monkeypatch.chdir(tmp_path)
    cfg = PPDConfig(model="random:tiny", dtype="float32", device="cpu", new_tokens=24)
    result = run_dry(PPDConfig, cfg, 1)
    sources = len(cfg.data.split(","))
    assert result.sequences == auto_prompts(default_of(cfg, "steps"), sources) * sources > sources


def test_a_dry_run_of_no_steps_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["train", "medusa", "--model", "random:tiny", "--dry-run", "--steps", "0"])
    assert res.exit_code != 0 and "--steps must be at least 1 (got 0)" in res.output

"""`specbench train X` is generated from X's config dataclass (train/configs.py): its options are the config's
fields, with their defaults, and what a command line gives reaches the trainer's config unchanged."""

from __future__ import annotations

import importlib
from dataclasses import fields
from pathlib import Path

import pytest
import typer

from specbench.cli import app
from specbench.errors import BadValue
from specbench.train.configs import CONFIGS, DrafterConfig, EagleConfig, MedusaConfig, TransferConfig
from specbench.train.settings import TRAINING_MIX, cli_fields, cli_options


def _command(name: str):
    root = typer.main.get_command(app)
    train = root.get_command(root.make_context("specbench", ["train"], resilient_parsing=True), "train")
    return train.get_command(train.make_context("train", [], resilient_parsing=True), name)


def _parsed(name: str, args: list[str]) -> dict:
    command = _command(name)
    return command.make_context(name, args).params


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda cls: cls.command)
def test_each_train_commands_options_are_its_configs_fields(cls):
    command = _command(cls.command)
    params = [p.name for p in command.params if p.name != "help"]
    assert params == list(cls.options)  # in help order
    assert set(params) == set(cli_fields(cls))  # every offered field, nothing else
    assert set(cli_fields(cls)) <= {f.name for f in fields(cls)}
    defaults = {f.name: f.default for f in fields(cls)}
    for param in command.params:
        if param.name in defaults:  # the option's default is the field's (as the option's own type says it)
            assert param.default == defaults[param.name] or param.name == "transfer_layers", param.name
        if param.param_type_name == "option" and param.name not in ("device_map", "max_memory", "eval_prompts"):
            assert param.help == cli_options(cls)[param.name]["help"]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda cls: cls.command)
def test_a_command_line_with_no_options_gives_the_configs_defaults(cls, monkeypatch):
    seen = []
    trainer = importlib.import_module(cls.trainer)
    monkeypatch.setattr(trainer, "train", lambda cfg: seen.append(cfg) or Path("unused"))
    monkeypatch.setattr("specbench.cli.train.REPORTS", {cls.command: lambda path, options: None})
    assert _command(cls.command).main([], standalone_mode=False) is None
    assert seen == [cls()]


def test_values_reach_the_config_converted_and_old_spellings_still_work(monkeypatch):
    from specbench.cli.train import configured

    assert configured(TransferConfig, _parsed("hidden-transfer", ["--transfer-layers", "1,3"])).transfer_layers \
        == (1, 3)
    assert configured(TransferConfig, _parsed("hidden-transfer", [])).transfer_layers is None
    assert configured(TransferConfig, _parsed("hidden-transfer", ["--masked"])).masked is True
    assert configured(EagleConfig, _parsed("eagle", ["--vocab-top", "0"])).vocab_top is None
    drafter = configured(DrafterConfig, _parsed("drafter", ["--batch", "3", "--data", "gsm8k", "--new-tokens", "12"]))
    assert (drafter.batch, drafter.data, drafter.new_tokens, drafter.eval_prompts) == (3, "gsm8k", 12, 20)
    with pytest.raises(BadValue, match="--transfer-layers: expected comma-separated integers"):
        configured(TransferConfig, _parsed("hidden-transfer", ["--transfer-layers", "1,x"]))
    medusa = configured(MedusaConfig, _parsed("medusa", []))
    assert (medusa.data, medusa.steps, medusa.positions) == (TRAINING_MIX, 400, 128)


def test_the_held_out_check_is_no_setting_a_checkpoint_must_match():
    """--eval-prompts only scores the artefact after training: a --resume may change it (the drafter's agreement
    check, not an option, stays in its settings as before)."""
    assert "eval_prompts" not in MedusaConfig().settings()
    assert DrafterConfig().settings()["eval_prompts"] == 20
    assert "steps" not in EagleConfig().settings() and EagleConfig().settings()["init"] == "none"

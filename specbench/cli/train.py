"""`specbench train ...`: one command per learned artefact (prompt tokens, drafters, heads, projections), each made
from its trainer's config dataclass (train/configs.py): a field is an option (name, type, default, help text from
settings.option), the class's docstring the command's help. Adding a trainer adds a config there; nothing here."""

from __future__ import annotations

import importlib
import inspect
import types
from pathlib import Path
from typing import Annotated, Any, Optional, Union, get_args, get_origin, get_type_hints

import typer
from rich.markup import escape

from ..errors import SpecbenchError
from ..progress import console
from .. import families
from ..train.configs import CONFIGS, DrafterConfig, PPDConfig
from ..train.settings import cli_options
from .app import train_app
from .placement_options import DeviceMap, MaxMemory, target_placement
from .train_eval import EvalPrompts, evaluate

# Options a train command shares with other commands: declared once with those (placement with every model-loading
# command, --eval-prompts with `train eval`), whatever the config says about them.
SHARED = {"device_map": DeviceMap, "max_memory": MaxMemory, "eval_prompts": EvalPrompts}


def option_type(cls: type, name: str, described: dict[str, Any]) -> Any:
    """The option's Python type for Typer: `cli_type`, else the field's annotation (X | None as Optional[X])."""
    kind = described.get("cli_type") or get_type_hints(cls)[name]
    if get_origin(kind) in (Union, types.UnionType):
        kind = Optional[next(a for a in get_args(kind) if a is not type(None))]
    return kind


def parameters(cls: type) -> list[inspect.Parameter]:
    """One keyword parameter per option of the config, in help order, annotated for Typer."""
    params = []
    for name, described in cli_options(cls).items():
        annotation = SHARED.get(name)
        if annotation is None:
            shown = described.get("shown")
            decls = [described["flag"]] if "flag" in described else []
            option = typer.Option(*decls, help=described.get("help"), metavar=described.get("metavar"),
                                  show_default=shown.format(command=cls.command) if isinstance(shown, str) else True)
            annotation = Annotated[option_type(cls, name, described), option]
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=described["default"],
                                        annotation=annotation))
    return params


def configured(cls: type, options: dict[str, Any]):
    """The config from a command's option values (each field's `convert` applied)."""
    described = cli_options(cls)
    return cls(**{name: described[name].get("convert", lambda v: v)(value) for name, value in options.items()})


def make_command(cls: type) -> None:
    """Register `specbench train <cls.command>`: builds the config, trains (importing the trainer, and torch, only
    now), scores the held-out prompts where the command has --eval-prompts, and says what it wrote."""

    def command(**options: Any) -> None:
        if options.get("dry_run"):
            return dry_run_command(cls, options)
        path = importlib.import_module(cls.trainer).train(configured(cls, options))
        REPORTS[cls.command](path, options)

    command.__signature__ = inspect.Signature(parameters(cls))  # what Typer reads; the body takes **options
    command.__name__ = "train_" + cls.command.replace("-", "_")
    command.__doc__ = cls.__doc__
    train_app.command(cls.command)(command)


DRY_STEPS = 3  # a dry run's optimiser steps where --steps is left at the full recipe's default (settings.py)


def dry_run_command(cls: type, options: dict[str, Any]) -> None:
    """`train X --dry-run`: the recipe on random data (train/dry_run.py); --steps left at its default runs
    DRY_STEPS, and the projection uses the default."""
    from ..train.dry_run import report, run_dry

    steps = options["steps"]
    if steps < 1:
        raise SpecbenchError(f"--steps must be at least 1 (got {steps}); leave it out for a {DRY_STEPS}-step dry run")
    if steps == cli_options(cls)["steps"]["default"]:
        steps = DRY_STEPS
    cfg = configured(cls, options)
    result = run_dry(cls, cfg, steps)
    report(cls.command, cfg, result)


# ------------------------------------------------------------------------------------- what each command says


def _said_ppd(path: Path, options: dict) -> None:
    artefact = families.get(PPDConfig.command).artefact
    meta = _heldout(path, artefact.meta, options)
    console.print(f"Wrote {escape(str(path))}/{artefact.weights}, {artefact.meta}, loss.png: {meta['steps']} steps, "
                  "final loss "
                  f"{meta['final_loss']} (from {meta['initial_loss']}), {_heldout_said(meta)}"
                  f"{meta['train_seconds']:.0f} s training + {meta['data_seconds']:.0f} s data.")


def _said_drafter(path: Path, options: dict) -> None:
    import yaml

    artefact = families.get(DrafterConfig.command).artefact
    meta = yaml.safe_load((path / artefact.meta).read_text())
    console.print(f"Wrote {escape(str(path))}/{artefact.weights}, {artefact.meta}, loss.png: "
                  f"{meta['parameters'] / 1e6:.1f} M own "
                  f"parameters, agreement with the target {meta['agreement']:.1%} (untrained "
                  f"{meta['agreement_untrained']:.1%}), speed ratio c = {meta['speed_ratio_c']}, "
                  f"{meta['train_seconds']:.0f} s training + {meta['data_seconds']:.0f} s data.")


def _heldout(path: Path, meta_file: str, options: dict) -> dict:
    """Score the new artefact on held-out prompts of its sources (at most those held out) unless
    --eval-prompts 0; returns its metadata, top1_heldout included."""
    import yaml

    prompts = min(options["eval_prompts"], options["held_out"])
    if prompts > 0:
        evaluate(path, options["model"], options["dtype"], options["device"], prompts,
                 placement=target_placement(options["device_map"], options["max_memory"]))
    return yaml.safe_load((path / meta_file).read_text())


def _heldout_said(meta: dict) -> str:
    return f"held-out top-1 per draft position {meta['top1_heldout']}, " if "top1_heldout" in meta else ""


def _before_said(meta: dict) -> str:
    """The agreement before training: untrained, or at the start of a sitting that went on from a trained drafter."""
    if "top1_agreement_at_start" in meta:
        return f"at the start {meta['top1_agreement_at_start']}"
    return f"untrained {meta['top1_agreement_untrained']}"


def _said_trained(meta_file: str, weights: str):
    def said(path: Path, options: dict) -> None:
        meta = _heldout(path, meta_file, options)
        console.print(f"Wrote {escape(str(path))}/{weights}, {meta_file}, loss.png: {meta['parameters'] / 1e6:.2f} M "
                      f"parameters, {_heldout_said(meta)}top-1 agreement on a training sample "
                      f"{meta['top1_agreement_train_sample']} ({_before_said(meta)}), final "
                      f"loss {meta['final_loss']} (from {meta['initial_loss']}), {meta['train_seconds']:.0f} s "
                      f"training + {meta['data_seconds']:.0f} s data.")

    return said


# the train commands whose report is their own; the others say what every trained artefact says
OWN_REPORTS = {PPDConfig: _said_ppd, DrafterConfig: _said_drafter}


def _report(cls: type):
    if cls in OWN_REPORTS:
        return OWN_REPORTS[cls]
    artefact = families.get(cls.command).artefact
    return _said_trained(artefact.meta, artefact.weights)


REPORTS = {cls.command: _report(cls) for cls in CONFIGS}  # command -> what it says after training

for _cls in CONFIGS:
    make_command(_cls)

"""The settings every trainer shares (TrainSettings, the base of each method's config dataclass), the default
training mix, and `option`: a config field that is also a `specbench train` option.

A config's fields are its command's options (cli/train.py generates the commands from them): the flag is
--<name with dashes> unless `flag` says otherwise, the type the field's annotation (or `cli_type`), the default the
field's default, the help text `help`. A subclass that only changes a default (`steps: int = 1500`) keeps the help
and the rest of the field's CLI description from its base (cli_options merges them along the class's MRO). Nothing
here imports torch: `specbench train X --help` reads these classes.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, ClassVar

from ..core import store
from ..errors import SpecbenchError

TRAINING_MIX = "alpaca-eval,stdlib-code,word-problems,stdlib-docs,chat-tasks"  # chat, code, maths, summaries: the
# offline mix the trainers default to (no benchmark prompt: data/disjoint.py)

# fields that may change between a run and its --resume (they never change what a step computes); a field can say so
# itself too (option(resumable=True))
RESUMABLE = ("steps", "resume", "out", "save_every")


def option(default: Any, help: str | None = None, *, flag: str | None = None, shown: str | bool | None = None,
           metavar: str | None = None, cli: bool | None = None, cli_type: type | None = None,
           convert: Callable[[Any], Any] | None = None, resumable: bool | None = None) -> Any:
    """A config field with its CLI description. help: the option's help text; flag: its spelling when not
    --<name> (a bool with one flag has no --no- form); shown: the default as help shows it (True: the value itself);
    metavar: what to type (default: cli/command.py's by name or type); cli=False: a setting no command offers;
    cli_type / convert: the option's own type and how its value becomes the field's; resumable: may change on
    --resume (kept out of the checkpoint's settings). Only what is given here overrides a base class's field."""
    given = dict(help=help, flag=flag, shown=shown, metavar=metavar, cli=cli, cli_type=cli_type, convert=convert,
                 resumable=resumable)
    return field(default=default, metadata={k: v for k, v in given.items() if v is not None})


def described(cls: type, name: str) -> dict[str, Any]:
    """Field `name`'s CLI description: its base class's first, each subclass's declaration of it on top."""
    meta: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        own = getattr(klass, "__dataclass_fields__", {}).get(name)
        if own is not None and name in vars(klass).get("__annotations__", {}):  # declared (again) here
            meta.update(own.metadata)
    return meta


def cli_fields(cls: type) -> list[str]:
    """The fields a command offers, in field order: every field but those marked cli=False."""
    return [f.name for f in fields(cls) if described(cls, f.name).get("cli", True)]


def cli_options(cls: type) -> dict[str, dict[str, Any]]:
    """The config's command options in help order (cls.options): name -> its description (above) plus `default`."""
    defaults = {f.name: f.default for f in fields(cls)}
    unknown = [name for name in cls.options if name not in cli_fields(cls)]
    if unknown:
        raise TypeError(f"{cls.__name__}.options names {unknown}, which are not options of it")
    return {name: {**described(cls, name), "default": None if defaults[name] is MISSING else defaults[name]}
            for name in cls.options}


@dataclass(frozen=True)
class TrainSettings:
    """Shared fields; each method's config subclasses it, adds its own fields and overrides defaults. A config
    names its command (`command`, also its artefact folder), its options in help order (`options`) and the module
    whose train(cfg) trains it (`trainer`); its docstring is the command's help."""

    command: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()
    trainer: ClassVar[str] = ""

    model: str = option("smollm2-135m", "Target model spec (the drafter is trained for it).")
    data: str = option(TRAINING_MIX, "Prompts to self-distil, comma-separated: datasets, files, or the training-only "
                       "sources (`specbench list datasets`).", flag="--dataset",
                       shown="the training mix: alpaca-eval and the training-only sources")
    steps: int = option(500, "Optimiser steps.")
    lr: float = option(1e-3, "Peak learning rate (warm-up, then cosine decay).")
    prompts: int | None = option(120, "Training prompts per source (after the held-out ones).")
    held_out: int = option(100, "First prompts of each source left out.")
    new_tokens: int = option(96, "Self-distilled reply length.", flag="--max-new-tokens")
    out: Path | None = option(None, "Artefact folder.", shown="artifacts/<model>/{command}")  # {command}: the folder
    dtype: str = option("auto", "auto, float32, bfloat16")
    device: str = option("auto", "auto, cpu, cuda or cuda:<i>")
    # --device-map / --max-memory (core/model/placement.py): the frozen target's placement; their CLI declaration is
    # the one every model-loading command shares (cli/placement_options.py)
    device_map: str | None = None
    max_memory: str | None = None
    save_every: int = option(100, "Checkpoint every N steps.")
    resume: bool = option(False, "Continue from the checkpoint in --out.")
    seed: int = option(0, "Data order.")
    data_file: str | None = option(None, "Read the one named --dataset from this file.", shown="the set's own")
    # held-out prompts scored after training (the command runs `train eval`; declared with it, cli/train_eval.py)
    eval_prompts: int = option(30, resumable=True)
    # train/dry_run.py: the recipe on random data, timed, its full cost projected; cli/train.py dispatches on it
    dry_run: bool = option(False, "Run the trainer's steps on random data for --steps steps (3 unless given) and "
                           "print the time per step, peak memory and the full recipe's projected cost; writes "
                           "nothing.", flag="--dry-run", resumable=True)

    def check_common(self) -> None:
        """Refuse shared settings no run can use (before any slow work)."""
        if self.steps < 1 or self.save_every < 1:
            raise SpecbenchError("--steps and --save-every must be at least 1")
        if not self.lr > 0:
            raise SpecbenchError(f"--lr must be positive (got {self.lr})")

    def settings(self) -> dict:
        """What a checkpoint must agree on to be resumed: every field but the resumable ones, paths as strings."""
        skip = set(RESUMABLE) | {f.name for f in fields(self) if described(type(self), f.name).get("resumable")}
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items() if k not in skip}

    def artifact_out(self, folder: str) -> Path:
        """--out, else artifacts/<model>/<folder> in the working directory (where decoding looks first)."""
        from ..core.model.load import model_slug  # imports torch: only when training

        return self.out or store.artifact_dir(model_slug(self.model), folder)

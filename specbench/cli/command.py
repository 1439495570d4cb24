"""The conventions every specbench command follows, applied in one place rather than option by option:

- old spellings of renamed options keep working, hidden from help (RENAMED, and per command `aliases`);
- help shows a metavar that says what to type (N, PATH, MODEL, ...; none for flags) and every default;
- commands are listed in the order a user walks them (`order` of a group).

SpecbenchTyper makes every command a SpecbenchCommand and every group a SpecbenchGroup.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from ..errors import BadValue, did_you_mean

# The exceptions of the Click that parses (app.py catches them): newer Typer releases carry their own copy of Click,
# older ones use Click itself.
try:
    from typer._click import exceptions as click_errors  # noqa: F401
except ImportError:
    from click import exceptions as click_errors  # noqa: F401

# Old spelling -> the one every command uses now. Each still works where the new spelling is an option of the
# command (and the old one is not, so a command may keep a name that is old elsewhere); help shows only the new one.
RENAMED = {
    "--batch-sizes": "--batch-size",
    "--kv-lengths": "--kv-length",
    "--new-tokens": "--max-new-tokens",
    "--data": "--dataset",
    "--batch": "--sequences",  # train drafter: sequences per optimiser step, as train eagle / parallelspec say
}

# What to type, by the option's parameter name: one word per idea, the same in every command.
NAME_METAVARS = {
    "model": "MODEL", "drafter": "MODEL", "method": "METHOD", "dataset": "DATASET", "data": "DATASET[,...]",
    "dtype": "DTYPE", "device": "DEVICE", "data_file": "FILE", "limit": "N|all", "out": "DIR", "out_dir": "DIR",
    "out_path": "PATH", "artifact": "DIR", "acceptance": "FILE", "baseline": "DIR|FILE", "junit": "FILE",
    "job_summary": "FILE", "artifact_url": "URL", "recommendation": "FILE", "gpu": "HARDWARE|FILE",
    "init": "DIR|auto|none", "tree": "TREE", "draft_device": "DEVICE", "runs": "DIR...", "folders": "DIR...",
}
TYPE_METAVARS = {int: "N", float: "NUMBER", Path: "PATH", str: "TEXT"}


def spell(param: Any) -> None:
    """A metavar that says what to type, and the default shown (flags: neither; they are on or off)."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", str)
    if param.param_type_name == "argument":  # its name is shown already: only the type column, as for options
        shown = NAME_METAVARS.get(param.name or "") or TYPE_METAVARS.get(annotation, "TEXT")
        param.display_type_rich = lambda ctx=None: shown
        usage = NAME_METAVARS.get(param.name or "") or (param.name or "ARG").upper()
        usage += "..." if param.nargs != 1 and not usage.endswith("...") else ""
        usage = usage if param.required else f"[{usage}]"
        param.get_usage_pieces = lambda ctx=None: [usage]  # the usage line: RUN... rather than Typer's {runs}...
        return
    if param.param_type_name != "option":
        return
    if param.is_flag:
        param.metavar = ""  # Typer would print <bool>
        return
    if param.metavar is None:
        param.metavar = NAME_METAVARS.get(param.name or "") or TYPE_METAVARS.get(annotation, "TEXT")
    if not isinstance(param.show_default, str):
        param.show_default = True


class SpecbenchCommand(TyperCommand):
    """A command in the house style. `aliases`: old spelling -> current one, for this command only."""

    aliases: dict[str, str] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            spell(param)

    def get_help_option(self, ctx: Any):
        option = super().get_help_option(ctx)
        if option is not None:
            spell(option)
        return option

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except BadValue as exc:
            exc.where = ctx.command_path  # for the hint beside the error line
            raise

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, spelled_now(self.get_params(ctx), {**RENAMED, **self.aliases}, args))
        except click_errors.UsageError as exc:
            exc.ctx = exc.ctx or ctx  # Click leaves it out of some (an option without its value): the hint needs it
            raise


def spelled_now(params: list[Any], renamed: dict[str, str], args: list[str]) -> list[str]:
    """`args` with old option spellings replaced by the current ones (`--data x`, `--data=x`); values and what
    follows `--` are left alone."""
    names = {opt for p in params for opt in p.opts}
    table = {old: new for old, new in renamed.items() if new in names and old not in names}
    takes_value = {opt for p in params if p.param_type_name == "option" and not p.is_flag and not p.count
                   for opt in p.opts}
    out: list[str] = []
    value_next = False
    for i, arg in enumerate(args):
        if value_next:
            out.append(arg)
            value_next = False
            continue
        if arg == "--":
            out += args[i:]
            break
        name, eq, value = arg.partition("=")
        name = table.get(name, name)
        out.append(name + eq + value)
        value_next = not eq and name in takes_value
    return out


class SpecbenchGroup(TyperGroup):
    """A command group in the house style, its commands listed in `order` (the rest after them, as registered)."""

    order: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            spell(param)

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(self.order)}
        return sorted(names, key=lambda name: rank.get(name, len(rank)))

    def get_help_option(self, ctx: Any):
        option = super().get_help_option(ctx)
        if option is not None:
            spell(option)
        return option

    def resolve_command(self, ctx: Any, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            ctx.fail(f"{ctx.command_path}: no such command {name!r}{did_you_mean(name, self.list_commands(ctx))}")
        return super().resolve_command(ctx, args)


class SpecbenchTyper(typer.Typer):
    """typer.Typer whose commands are SpecbenchCommands; `aliases` (old spelling -> new) for one command's own
    renamed options, `cls` for a command that needs more (run's method options)."""

    def __init__(self, *, order: tuple[str, ...] = (), **kwargs: Any) -> None:
        group = type("Group", (kwargs.pop("cls", SpecbenchGroup),), {"order": order})
        super().__init__(cls=group, **kwargs)

    def command(self, *args: Any, cls: type[SpecbenchCommand] = SpecbenchCommand,
                aliases: dict[str, str] | None = None, **kwargs: Any):
        if aliases:
            cls = type(cls.__name__, (cls,), {"aliases": aliases})
        return super().command(*args, cls=cls, **kwargs)

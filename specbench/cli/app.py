"""The Typer app, its two command groups (list, train), the one error style and the console entry point.

Every failure ends the same way: one `error:` line naming what was wrong (the option and its value where there is
one), a hint where one helps, a non-zero exit status; no traceback and no Click panel. Nothing here imports torch:
`specbench --help` stays fast (each command imports what it needs in its body).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.markup import escape

from .. import __version__
from ..errors import BadValue, SpecbenchError, did_you_mean
from ..progress import console, out, quiet_libraries
from ..train.configs import CONFIGS
from .command import RENAMED, SpecbenchGroup, SpecbenchTyper, click_errors

# This invocation's arguments (without the program name): `run` repeats them in the command that resumes it.
invocation: list[str] = []

# The order a user walks the commands: look at the machine and what is there, measure the hardware and the
# guesses, build trees, train, pick a method, run, join shards, report.
WORKFLOW = ("env", "list", "profile", "estimate", "build-tree", "plan", "train", "recommend", "run", "map", "merge", "report")


class _Root(SpecbenchGroup):
    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        invocation[:] = sys.argv[1:] if args is None else [str(a) for a in args]
        try:
            code = super().main(args=list(invocation), prog_name="specbench", complete_var=complete_var,
                                standalone_mode=False, **extra)
            code = code if isinstance(code, int) else 0
        except BadValue as exc:
            code = _error(str(exc), exc.exit_code, f"`{exc.where} --help` lists the options")
        except SpecbenchError as exc:
            code = _error(str(exc), exc.exit_code)
        except click_errors.NoArgsIsHelpError as exc:
            code = exc.exit_code  # `specbench` or `specbench train` alone: the help is already printed
        except click_errors.ClickException as exc:
            message, hint = usage_error(exc)
            code = _error(message, exc.exit_code, hint)
        except typer.Abort:
            code = _error("aborted", 1)
        if not standalone_mode:
            return code
        sys.exit(code)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # Click would turn it into a silent exit 130
            console.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None


def _error(message: str, code: int, hint: str = "") -> int:
    console.print(f"[bold red]error:[/] {escape(message)}")
    if hint:
        console.print(f"[dim]hint: {escape(hint)}[/]")
    return code


def usage_error(exc: Any) -> tuple[str, str]:
    """A Click usage error (unknown option or command, bad value, missing argument) as (message, hint)."""
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else "specbench"
    hint = f"`{where} --help` lists the " + ("commands" if hasattr(getattr(ctx, "command", None), "list_commands")
                                             else "options")
    if isinstance(exc, click_errors.NoSuchOption) and ctx is not None:
        known = [opt for p in ctx.command.get_params(ctx) if not p.hidden for opt in p.opts if opt.startswith("--")]
        return f"{where}: no such option {exc.option_name}{did_you_mean(exc.option_name, known)}", hint
    if isinstance(exc, click_errors.MissingParameter):
        return f"{where}: {_lower(exc.format_message())}", hint
    if isinstance(exc, click_errors.BadParameter) and exc.param is not None:
        flag = next((o for o in exc.param.opts if o.startswith("--")), exc.param.name or "value")
        given = _given(exc.param.opts)
        value = f" {given!r}" if given is not None else ""
        return f"{flag}{value}: {_lower(exc.message)}", hint
    return f"{where}: {_lower(exc.format_message())}" if ctx is not None and where not in exc.message \
        else exc.format_message(), hint


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:]


def _given(opts: list[str]) -> str | None:
    """The value this invocation gave an option (its last `--opt value` or `--opt=value`, old spellings too)."""
    opts = [*opts, *(old for old, new in RENAMED.items() if new in opts)]
    found = None
    for i, arg in enumerate(invocation):
        name, eq, value = arg.partition("=")
        if name in opts:
            found = value if eq else (invocation[i + 1] if i + 1 < len(invocation) else None)
    return found


app = SpecbenchTyper(
    cls=_Root, order=WORKFLOW, add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},  # every command's context inherits it
    pretty_exceptions_enable=False,
    help="Benchmark speculative and parallel decoding methods on your own hardware.\n\n"
         "Start with [bold]specbench run[/] (ar vs pld on HumanEval with the embedded SmolLM2-135M).")
list_app = SpecbenchTyper(help="List methods and datasets.", no_args_is_help=True, order=("methods", "datasets"))
app.add_typer(list_app, name="list")
train_app = SpecbenchTyper(help="Train the small artefacts some methods need (drafters, prompt tokens, ...).",
                           no_args_is_help=True,
                           order=(*(config.command for config in CONFIGS), "eval"))
app.add_typer(train_app, name="train")


def _version(value: bool):
    if value:
        out.print(f"specbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False):
    pass


def main() -> None:
    """Console-script entry point: quiet library logging, then the Typer app."""
    quiet_libraries()
    app()

"""The Typer app, its two command groups (list, train), the clear-error wrapper and the console entry point."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from typer.core import TyperGroup

from .. import __version__
from ..errors import SpecbenchError
from ..progress import console, out, quiet_libraries


class _ClearErrors(TyperGroup):
    """User mistakes (SpecbenchError) print one clear line and exit non-zero, without a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpecbenchError as exc:
            console.print(f"[bold red]error:[/] {escape(str(exc))}")
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None


app = typer.Typer(
    cls=_ClearErrors, add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    help="Benchmark speculative and parallel decoding methods on your own hardware.\n\n"
         "Start with [bold]specbench run[/] (ar vs pld on HumanEval with the embedded SmolLM2-135M).")
list_app = typer.Typer(help="List methods and datasets.", no_args_is_help=True)
app.add_typer(list_app, name="list")
train_app = typer.Typer(help="Train the small artefacts some methods need (drafters, prompt tokens, ...).",
                        no_args_is_help=True)
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


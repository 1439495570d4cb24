"""`run`'s per-method options (--gamma, --tree, --pld-ngram, ...), declared on the method classes
(methods/options.py, `option_specs`).

Reading them means importing the methods registry, and so torch (seconds). Two things keep help light:
- they become options of `run` only when `run` itself is resolved (WithMethodOptions), so `specbench --help`
  never reads them;
- what they are is kept in a small catalogue in the specbench cache folder, keyed by the package's source files
  (their names, sizes and modification times): `specbench run --help` reads it instead of the registry until a
  source file changes, and a changed file rebuilds it from the registry. Nothing to regenerate by hand.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from .. import __version__
from .command import SpecbenchCommand, spell

PANEL = "Method options"
_TYPES = {"int": int, "float": float, "str": str}
_META = "specbench.method_options"  # ctx.meta key: the method options' values, for run's body


def catalogue() -> list[dict[str, Any]]:
    """Every method option: name, flag, type, default, help, choices, unset (what a None default means) and the
    methods that take it; from the cached catalogue when the sources have not changed, else from the registry."""
    key = _sources_key()
    path = _cache_file()
    try:
        cached = json.loads(path.read_text())
        if cached["key"] == key:
            return cached["options"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, unreadable or from other sources: rebuild
    options = from_registry()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(f"{path.name}.{os.getpid()}")
        scratch.write_text(json.dumps({"key": key, "options": options}))
        os.replace(scratch, path)  # whole or not at all, with several processes at once
    except OSError:
        pass  # a read-only cache only costs the registry import next time
    return options


def from_registry() -> list[dict[str, Any]]:
    """The catalogue as the registered methods declare it (imports them, and torch)."""
    from ..methods import REGISTRY, all_options

    return [{"name": name, "flag": spec.flag, "type": spec.type.__name__, "default": spec.default, "help": spec.help,
             "choices": list(spec.choices), "unset": spec.unset, "methods": list(methods)}
            for name, (spec, methods) in all_options(REGISTRY).items()]


def _cache_file() -> Path:
    from ..core.store import user_cache

    return user_cache() / "cli" / "method-options.json"


def _sources_key() -> str:
    """Changes whenever a source file of the package is added, removed or edited (or the version changes)."""
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha1(__version__.encode())
    for path in sorted(package.rglob("*.py")):
        try:
            stat = path.stat()
        except OSError:
            continue  # removed while we looked
        digest.update(f"{path.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def method_params() -> list[Any]:
    """One Typer option per catalogue entry, in the "Method options" panel."""
    params = []
    for entry in catalogue():
        kind = _TYPES[entry["type"]]
        chooses = entry["default"] is None and kind is not str  # `auto` or a number (e.g. --gamma auto)
        text = f"{', '.join(entry['methods'])}: {escape(entry['help'])}"
        text += f" ({', '.join(entry['choices'])})" if entry["choices"] else ""
        text += " (auto: the method chooses)." if chooses else "."
        shown = "auto" if chooses else (entry["unset"] if entry["default"] is None else True)
        option = typer.Option(entry["flag"], help=text, rich_help_panel=PANEL, show_default=shown,
                              metavar=f"auto|{'N' if kind is int else 'NUMBER'}" if chooses else
                              "|".join(entry["choices"]) or None)
        params.append(inspect.Parameter(entry["name"], inspect.Parameter.KEYWORD_ONLY, default=entry["default"],
                                        annotation=Annotated[Optional[str if chooses else kind], option]))

    def options(**values):  # a signature for Typer to read; never called
        pass

    options.__signature__ = inspect.Signature(params)
    scratch = typer.Typer(add_completion=False)
    scratch.command()(options)
    return [p for p in typer.main.get_command(scratch).params if p.name != "help"]


class WithMethodOptions(SpecbenchCommand):
    """A command (`run`) that also takes every method option: added when the command is resolved (to parse its
    arguments or show its help), handed to its body through `given_method_options(ctx)`."""

    _method_params: list[Any] | None = None

    def get_params(self, ctx: Any) -> list[Any]:
        if self._method_params is None:
            self._method_params = method_params()
            for param in self._method_params:
                spell(param)
            self.params = [*self.params, *self._method_params]
        return super().get_params(ctx)

    def invoke(self, ctx: Any) -> Any:
        names = {p.name for p in self._method_params or ()}
        ctx.meta[_META] = {name: ctx.params.pop(name) for name in list(ctx.params) if name in names}
        return super().invoke(ctx)


def given_method_options(ctx: Any) -> dict[str, Any]:
    """The method options' values of this invocation (None: not given), by name."""
    return dict(ctx.meta.get(_META, {}))

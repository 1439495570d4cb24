"""Method-specific options: each method class declares its own (`option_specs`), and the CLI, run.yaml and
`specbench list methods` read them from there, so a new method adds options without widening a shared list.

An `Option` is one knob: its CLI flag is --<name with dashes>, its run.yaml key the name. Several methods may share
an option (sd and pearl both take --gamma) by declaring the same `Option` object; two different declarations of one
name are a programming error, caught when the registry is read (`all_options`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SpecbenchError


@dataclass(frozen=True)
class Option:
    name: str  # a Python identifier: pld_ngram -> --pld-ngram, run.yaml key pld_ngram
    type: type  # int | float | str
    default: Any  # None = "the method chooses" (say how in `help`)
    help: str
    minimum: float | None = None  # smallest allowed value (numbers)
    choices: tuple[str, ...] = ()  # allowed values (strings)
    unset: str = "chosen"  # what a None default means, for `list methods` ("chosen", "shipped", "none")

    @property
    def default_text(self) -> str:
        return f"({self.unset})" if self.default is None else str(self.default)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> Any:
        """The value converted to `type` and checked; a clear error naming the flag otherwise."""
        if value is None or (value == "auto" and self.default is None and self.type is not str):
            return None  # `auto` (e.g. --gamma auto): the method chooses, as when the option is left out
        try:
            value = self.type(value)
        except (TypeError, ValueError):
            raise SpecbenchError(f"{self.flag}: expected {self.type.__name__}, got {value!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecbenchError(f"{self.flag}: expected a finite number, got {value}")
        if self.minimum is not None and value < self.minimum:
            raise SpecbenchError(f"{self.flag} must be at least {self.minimum:g} (got {value})"
                                 + ("; leave it out to let the method choose" if self.default is None else ""))
        if self.choices and value not in self.choices:
            raise SpecbenchError(f"unknown {self.flag} {value!r}; choose from {', '.join(self.choices)}")
        return value


class OptionValues(Mapping):
    """The option values one method instance sees, defaults filled in: `options.gamma`, `options["gamma"]`."""

    def __init__(self, specs: tuple[Option, ...], given: Mapping[str, Any] | None = None, owner: str = "method"):
        given = dict(given or {})
        known = {o.name: o for o in specs}
        unknown = sorted(set(given) - set(known))
        if unknown:
            flags = ", ".join("--" + n.replace("_", "-") for n in unknown)
            takes = ", ".join(o.flag for o in specs) or "no options"
            raise SpecbenchError(f"{owner} does not take {flags} (it takes {takes})")
        self._values = {name: spec.check(given.get(name, spec.default)) for name, spec in known.items()}

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def replace(self, **changes) -> dict[str, Any]:
        """A plain dict of these values with some changed (e.g. a tree-size sweep's tree=size=N)."""
        return {**self._values, **changes}

    def __repr__(self) -> str:
        return f"OptionValues({self._values})"


# Options several kinds of method share (tree methods: ppd today; medusa, hidden-transfer, parallelspec next).
TREE = Option("tree", str, "auto", "the draft tree: auto (this hardware's tree from `build-tree`), a trees/*.yaml "
              "path, size=N (searched now), or for eagle and parallelspec dynamic[=M] (EAGLE-2: M candidates chosen per step; "
              "M defaults to the size auto picks)")
ARTIFACT = Option("artifact", str, None, "trained artefact (prompt tokens, heads, ...) to use instead of the shipped "
                  "one; eagle and medusa also take the authors' released checkpoints (docs/methods.md)",
                  unset="shipped")


def all_options(registry: Mapping[str, type]) -> dict[str, tuple[Option, list[str]]]:
    """Every option of the registered methods: name -> (declaration, the methods that take it)."""
    out: dict[str, tuple[Option, list[str]]] = {}
    for method, cls in registry.items():
        for spec in cls.option_specs:
            if spec.name in out and out[spec.name][0] != spec:
                raise RuntimeError(f"option {spec.name!r} is declared twice, differently "
                                   f"({out[spec.name][1][0]} and {method}): share one Option object")
            out.setdefault(spec.name, (spec, []))[1].append(method)
    return out


def split_by_method(values: Mapping[str, Any], methods, registry: Mapping[str, type]) -> dict[str, dict[str, Any]]:
    """Per method: the options it declares, taken from one flat dict of every option's value (the CLI's)."""
    return {m: {o.name: values[o.name] for o in registry[m].option_specs if o.name in values} for m in methods}

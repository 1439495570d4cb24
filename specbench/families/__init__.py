"""The method families' declarations (record.py: Family), one module each, and their registry.

Planning, training, the store and the CLI read a family's declaration here instead of naming families; the
family's code (guesser, artefact, training, scoring) lives in specbench/methods/<family>/ and is reached through the
declaration's import strings. The declarations sit here, not in the family folders, because importing anything
under specbench.methods runs its __init__, which imports every family (and torch): this package stays torch-free
so `--help`, planning and the store can read it. Adding a family: its folder under methods/, its declaration module
here, and its line in FAMILIES' list below (the order of `specbench list methods`)."""

from __future__ import annotations

from ..errors import SpecbenchError
from . import ar, eagle, eagle3, hidden_transfer, lookahead, medusa, parallelspec, pearl, pld, ppd, sd, suffix
from .record import Artefact, Family, load

__all__ = ["Artefact", "Family", "load", "register", "get", "find", "tree_families", "trained", "tree_stem", "method_flag",
           "DEFAULT_TREE_FAMILY", "FAMILIES"]

FAMILIES: dict[str, Family] = {}
DEFAULT_TREE_FAMILY = ppd.FAMILY.name  # estimate / build-tree / train eval's default --method


def register(family: Family) -> Family:
    """Add a family (a name already registered is refused: it keys files on disk)."""
    if family.name in FAMILIES and FAMILIES[family.name] is not family:
        raise ValueError(f"family {family.name!r} is already registered")
    FAMILIES[family.name] = family
    return family


def find(name: str | None) -> Family | None:
    """The family of this name or alias (an artefact's metadata may name its alias), or None."""
    if name in FAMILIES:
        return FAMILIES[name]
    return next((f for f in FAMILIES.values() if name in f.aliases), None)


def get(name: str) -> Family:
    found = find(name)
    if found is None:
        raise SpecbenchError(f"unknown method family {name!r}; families: {', '.join(FAMILIES)}")
    return found


def tree_families() -> tuple[str, ...]:
    """The tree families' names, in registry order: what estimate, build-tree and plan take as --method."""
    return tuple(f.name for f in FAMILIES.values() if f.tree)


def trained() -> tuple[Family, ...]:
    """Families with a `specbench train` command, in registry order."""
    return tuple(f for f in FAMILIES.values() if f.train_config)


def tree_stem(name: str, stem: str) -> str:
    """A family's tree file stem: `<hardware>-<dtype>` with the family's prefix (Family.tree_stem)."""
    return get(name).tree_stem(stem)


def method_flag(name: str) -> str:
    """The ` --method F` a suggested estimate / build-tree command needs ('' for the default family)."""
    return "" if name == DEFAULT_TREE_FAMILY else f" --method {name}"


# one entry per family, in the order of `specbench list methods`
for _module in (ar, ppd, medusa, eagle, eagle3, parallelspec, hidden_transfer, pld, suffix, lookahead, sd, pearl):
    register(_module.FAMILY)

"""Parsing of comma-separated option values into lists, with errors that name the option."""

from __future__ import annotations

from ..errors import SpecbenchError


def int_list(text: str, option: str) -> list[int]:
    return number_list(text, option, int, "integers")


def float_list(text: str, option: str) -> list[float]:
    return number_list(text, option, float, "numbers")


def number_list(text: str, option: str, kind, what: str) -> list:
    """A comma-separated option value as numbers of `kind`; a clear error names the option."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SpecbenchError(f"{option}: expected comma-separated {what}, got {text!r}") from None
    if not values:
        raise SpecbenchError(f"{option}: give at least one value")
    return values


def tree_size_list(text: str) -> tuple[int, ...]:
    """--tree-sizes: positive sizes and `auto` (0 in RunConfig.tree_sizes: the method's --tree auto choice)."""
    sizes = []
    for part in (v.strip() for v in text.split(",") if v.strip()):
        size = 0 if part == "auto" else int_list(part, "--tree-sizes")[0]
        if part != "auto" and size < 1:
            raise SpecbenchError(f"--tree-sizes: sizes must be positive integers or auto (got {part})")
        sizes.append(size)
    if not sizes:
        raise SpecbenchError("--tree-sizes: give at least one size")
    return tuple(dict.fromkeys(sizes))

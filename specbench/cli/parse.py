"""Parsing of option values (comma-separated lists, --limit N or all), with errors that name the option and the
value."""

from __future__ import annotations

from ..errors import BadValue


def int_list(text: str, option: str) -> list[int]:
    return number_list(text, option, int, "integers")


def float_list(text: str, option: str) -> list[float]:
    return number_list(text, option, float, "numbers")


def number_list(text: str, option: str, kind, what: str) -> list:
    """A comma-separated option value as numbers of `kind`; a clear error names the option."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BadValue(f"{option}: expected comma-separated {what}, got {text!r}") from None
    if not values:
        raise BadValue(f"{option}: give at least one value")
    return values


def tree_size_list(text: str) -> tuple[int, ...]:
    """--tree-sizes: positive sizes and `auto` (0 in RunConfig.tree_sizes: the method's --tree auto choice)."""
    sizes = []
    for part in (v.strip() for v in text.split(",") if v.strip()):
        size = 0 if part == "auto" else int_list(part, "--tree-sizes")[0]
        if part != "auto" and size < 1:
            raise BadValue(f"--tree-sizes: sizes must be positive integers or auto (got {part})")
        sizes.append(size)
    if not sizes:
        raise BadValue("--tree-sizes: give at least one size")
    return tuple(dict.fromkeys(sizes))


ALL_PROMPTS = 1_000_000_000  # `--limit all`: more prompts than any set holds, so every prompt is taken


def prompt_limit(text: str, option: str = "--limit") -> int:
    """--limit N or --limit all, refused with the option and its value named otherwise."""
    if text.strip().lower() == "all":
        return ALL_PROMPTS
    try:
        limit = int(text)
    except ValueError:
        raise BadValue(f"{option} {text!r}: expected a number of prompts or all") from None
    if limit < 1:
        raise BadValue(f"{option} must be at least 1 (got {limit}); all takes every prompt")
    return limit

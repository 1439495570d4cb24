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

"""User-facing errors: the CLI prints their message and exits non-zero, without a traceback."""

from __future__ import annotations

from collections.abc import Iterable


class SpecbenchError(Exception):
    """A mistake in the user's input or environment, with a message that says what to do."""

    exit_code = 2


class BadValue(SpecbenchError):
    """An option's value that cannot be read (the CLI points at the command's help beside it)."""

    where = "specbench"  # the command whose option it was (set by the CLI as the error passes)


def did_you_mean(given: str, known: Iterable[str]) -> str:
    """" (did you mean 'pld'?)" when `given` is a typo of a known name (a few letters wrong, missing, extra or
    swapped), else "": the unknown-name errors (methods, datasets, options) carry their fix in the same line."""
    allowed = max(1, len(given) // 4)  # a short name tolerates one slip, a long one a few
    scored = sorted((_typo_distance(given.lower(), name.lower()), name) for name in known)
    best = [name for d, name in scored if d <= allowed and d == scored[0][0]][:2]
    return f" (did you mean {' or '.join(repr(name) for name in best)}?)" if best else ""


def _typo_distance(a: str, b: str) -> int:
    """Edits (insert, delete, replace, swap two neighbours) that turn a into b: pdl -> pld is one, pdl -> ppd two."""
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(rows[i - 1][j] + 1, row[j - 1] + 1, rows[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], rows[i - 2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]

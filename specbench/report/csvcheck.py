"""Reading result CSVs defensively: a malformed file is named with the line that is wrong, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import SpecbenchError

EMPTY = {"", "nan", "NaN", "None", "none", "null"}  # what a cell with no number may hold (written by pandas or hand)


def read_csv(path: Path, what: str, **kwargs) -> pd.DataFrame:
    """pd.read_csv with parser failures turned into one line that names the file (pandas names the line)."""
    try:
        return pd.read_csv(path, **kwargs)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise SpecbenchError(f"{path}: not a readable {what} ({' '.join(str(exc).split())})") from exc
    except OSError as exc:
        raise SpecbenchError(f"{path}: cannot read it ({exc.strerror or exc})") from exc


def require_columns(df: pd.DataFrame, path: Path, columns: set[str], what: str) -> None:
    missing = columns - set(df)
    if missing:
        raise SpecbenchError(f"{path}: missing columns {', '.join(sorted(missing))}; is it a {what} written by "
                             "`specbench run` / `specbench report`?")


def numeric(df: pd.DataFrame, path: Path, columns) -> pd.DataFrame:
    """`columns` (those present) as numbers; a cell that is neither a number nor empty is an error naming the file,
    its line (the header is line 1), the row's method / dataset, the column and the value."""
    df = df.copy()
    for col in columns:
        if col not in df:
            continue
        values = pd.to_numeric(df[col], errors="coerce")
        text = df[col].astype(str).str.strip()
        bad = values.isna() & ~text.isin(EMPTY) & df[col].notna()
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            row = df.iloc[i]
            where = ", ".join(f"{k} {row[k]}" for k in ("method", "dataset") if k in df)
            raise SpecbenchError(f"{path}, line {i + 2}{f' ({where})' if where else ''}: {col} is "
                                 f"{df[col].iloc[i]!r}, not a number. Fix or remove that row, or re-create the file "
                                 "with `specbench report`.")
        df[col] = values
    return df

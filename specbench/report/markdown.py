"""Markdown tables for report.md and the timeline section (numbers to 3 significant digits, NaN left empty)."""

from __future__ import annotations

import math

import pandas as pd


def markdown_table(df: pd.DataFrame) -> str:
    def cell(v):
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)

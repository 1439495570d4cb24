"""Whether `specbench recommend`'s pick is within 5% of the best method of a full run on the same prompts (issue 29's
goal): the pick's speedup over ar in the full run against the best lossless method's there, on the dataset the
recommendation was confirmed on (batch 1 rows of the full run's summary.csv).

Usage: python benchmarks/recommend_check.py RECOMMENDATION_YAML FULL_RUN_DIR   (exit 1 when the pick is > 5% behind)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import yaml

TOLERANCE = 0.05


def check(rec_file: Path, run_dir: Path) -> tuple[pd.DataFrame, str, float]:
    """(the full run's rows on the recommendation's dataset, best first; the pick's method; pick / best ratio)."""
    rec = yaml.safe_load(rec_file.read_text())
    dataset = (rec.get("confirmed_on") or {}).get("dataset")
    df = pd.read_csv(run_dir / "summary.csv")
    df = df[(df.batch_size == 1) & (df.dataset == dataset if dataset else True)]
    lossless = df[df.lossless_rate.fillna(1.0) >= 1.0] if rec["dtype"] == "float32" else df  # ar's rate: NaN
    rows = lossless[["method", "speedup", "speedup_lo", "speedup_hi", "lossless_rate"]]
    rows = rows.sort_values("speedup", ascending=False).reset_index(drop=True)
    if rec["method"] not in set(rows.method):
        sys.exit(f"{run_dir}: no lossless row of the pick {rec['method']!r} on {dataset}")
    pick = float(rows[rows.method == rec["method"]].speedup.iloc[0])
    return rows, rec["method"], pick / float(rows.speedup.iloc[0])


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows, pick, ratio = check(Path(sys.argv[1]), Path(sys.argv[2]))
    print(rows.to_string(index=False))
    verdict = "within" if ratio >= 1 - TOLERANCE else "NOT within"
    print(f"pick {pick}: {ratio:.3f} of the best ({rows.method.iloc[0]}), {verdict} {TOLERANCE:.0%}")
    sys.exit(0 if ratio >= 1 - TOLERANCE else 1)


if __name__ == "__main__":
    main()

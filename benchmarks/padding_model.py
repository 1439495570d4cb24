"""Benchmark notes: EMS-SD's padding model (Appendix B, Figure 7) as Markdown tables for the RESULTS docs.

Prints E[M] (the batch's longest accepted length per step), E[P] (padding entries per sample per step) and
R = E[P] / E[M] (the share of KV entries the padded way of batching writes as padding) over next-token accuracy p
and batch size B, for maximum acceptance length K (Figure 7: K = 8), computed exactly by
specbench.planning.padding_model. With --run, also the measured KV padding ratio of that run's padded batches beside
the model's at the run's tau, batch size and draft length.

    python benchmarks/padding_model.py [--max-accept 8] [--batch-sizes 1,2,4,8,12,16,20,24] [--run results/DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from specbench.planning import padding_model as pm
from specbench.report.markdown import markdown_table
from specbench.report.run_report import read_records

ACCURACIES = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)  # Figure 7's range of p
BATCHES = (1, 2, 4, 8, 12, 16, 20, 24)  # Figure 7 runs B from 1 to 24; these columns keep the table readable


def grid(rows: list[dict], value: str, fmt: str) -> pd.DataFrame:
    """One quantity of the model as a p x B grid (p down, B across), formatted for Markdown."""
    frame = pd.DataFrame(rows).pivot(index="p", columns="B", values=value)
    out = frame.map(fmt.format)  # strings, so markdown_table does not round R's percentages to 3 digits
    out.columns = [f"B={b}" for b in frame.columns]
    return out.reset_index().assign(p=lambda d: d.p.map("{:g}".format))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-accept", type=int, default=8, help="K = draft length + 1 (Figure 7: 8)")
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCHES)))
    parser.add_argument("--accuracy", default=",".join(map(str, ACCURACIES)))
    parser.add_argument("--run", type=Path, help="a run folder: measured vs model padding ratio")
    args = parser.parse_args()
    ps = [float(v) for v in args.accuracy.split(",")]
    batches = [int(v) for v in args.batch_sizes.split(",")]
    rows = pm.table(ps, batches, args.max_accept)
    for value, fmt, what in (("E[M]", "{:.2f}", "maximum acceptance length"),
                             ("E[P]", "{:.2f}", "average padding length"),
                             ("R", "{:.1%}", "padding ratio E[P] / E[M]")):
        print(f"\n**{value}, {what}** (EMS-SD Appendix B model, K = {args.max_accept})\n")
        print(markdown_table(grid(rows, value, fmt)))
    if args.run:
        print(f"\n**Measured vs model KV padding ratio**, {args.run}\n")
        frame = pm.measured(read_records(args.run))
        print(markdown_table(frame) if not frame.empty else "(no padded batches with batch size > 1 in this run)")


if __name__ == "__main__":
    main()

"""The report's "By prompt length" section (report/context.py): buckets from ar's prompt lengths, tau and speedup
per bucket against ar on the same turns, too-small buckets left without numbers, context.csv / context.png."""

from __future__ import annotations

import math

import pandas as pd
import yaml

from specbench.report import run_report as report
from specbench.report import context

# prompt id -> (ar's prompt tokens, pld wall_s, pld target forwards); every turn emits 30 tokens, ar at 10 tok/s
TURNS = {"a": (100, 1.0, 10), "b": (150, 1.5, 15), "c": (200, 2.0, 20),        # <256: 90 tokens in 4.5 s, 45 fwd
         "d": (1200, 2.0, 20), "e": (1500, 2.5, 25), "f": (1800, 3.0, 30),    # 1k-2k: 90 tokens in 7.5 s, 75 fwd
         "g": (3000, 2.0, 20)}                                                   # 2k-4k: one turn only


def records() -> pd.DataFrame:
    rows = []
    for pid, (tokens, wall, forwards) in TURNS.items():
        rows.append({"method": "ar", "dataset": "cnn-dm-long", "prompt_id": pid, "turn": 0, "prompt_tokens": tokens,
                     "new_tokens": 30, "wall_s": 3.0, "tokens_per_s": 10.0, "target_forwards": 30, "drafted": 0,
                     "accepted_drafts": 0, "lossless": "", "peak_mem_mb": 100.0})
        # pld's own prompt length of "f" is put past 2k: the bucket must still come from ar's record (1k-2k)
        rows.append({"method": "pld", "dataset": "cnn-dm-long", "prompt_id": pid, "turn": 0,
                     "prompt_tokens": 2100 if pid == "f" else tokens, "new_tokens": 30, "wall_s": wall,
                     "tokens_per_s": 30 / wall, "target_forwards": forwards, "drafted": 40,
                     "accepted_drafts": 30 - forwards, "lossless": "match", "peak_mem_mb": 100.0})
    return pd.DataFrame(rows)


def test_bucket_edges():
    assert [context.bucket_of(n) for n in (0, 255, 256, 1023, 1024, 2047, 2048, 4095, 4096)] == \
        ["<256", "<256", "256-1k", "256-1k", "1k-2k", "1k-2k", "2k-4k", "2k-4k", ">=4k"]
    assert context.bucket_of(math.nan) == ""


def test_table_per_bucket_against_ar_on_the_same_turns():
    table = context.by_prompt_length(records())
    pld = table[table.method == "pld"].set_index("bucket")
    assert list(pld.index) == ["<256", "1k-2k", "2k-4k"]  # length order; empty buckets left out
    assert pld.loc["<256", "turns"] == 3 and pld.loc["<256", "prompt_tokens"] == 150
    assert pld.loc["<256", "tau"] == 2.0 and pld.loc["<256", "speedup"] == 2.0  # 90/45; (90/4.5) / (90/9)
    assert pld.loc["1k-2k", "turns"] == 3 and pld.loc["1k-2k", "prompt_tokens"] == 1500  # ar's
    assert pld.loc["1k-2k", "tau"] == 1.2 and pld.loc["1k-2k", "speedup"] == 1.2  # 90/75; (90/7.5) / (90/9)
    assert pld.loc["1k-2k", "tokens_per_s"] == 12.0 and pld.loc["1k-2k", "note"] == ""
    one = pld.loc["2k-4k"]  # one turn: no number that could mislead, and a note saying why
    assert one.turns == 1 and math.isnan(one.tau) and math.isnan(one.speedup)
    assert one.note.startswith("too few turns (1 < 3)")
    ar = table[table.method == "ar"].set_index("bucket")
    assert list(ar.turns) == [3, 3, 1] and ar.loc["<256", "tau"] == 1.0 and ar.loc["1k-2k", "speedup"] == 1.0


def test_no_prompt_lengths_no_section(tmp_path):
    assert context.section(records().drop(columns="prompt_tokens"), tmp_path) == []
    assert not (tmp_path / "context.csv").exists()


def test_run_report_has_the_section_csv_and_plot(tmp_path):
    records().to_csv(tmp_path / "records.csv", index=False)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"model": {"name": "SmolLM2-135M-Instruct"}}))
    report.write_run_report(tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "## By prompt length" in md and "too few turns (1 < 3)" in md and "![tau and speedup" in md
    saved = pd.read_csv(tmp_path / "context.csv")
    assert list(saved.columns) == context.COLUMNS and len(saved) == 6
    assert (tmp_path / "context.png").stat().st_size > 1000

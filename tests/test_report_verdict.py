"""Issue 41 section 4: report.md leads with its verdict (timing first, PARTIAL, lossless failures, few prompts, one
sentence per dataset), then the console's compact table; settings and environment last without None or reprs; the
41-column table in summary.csv and an appendix; `report A B` warns when the runs' settings differ and keeps the
timing column."""

from __future__ import annotations

import pandas as pd
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.report import compact, run_report, runinfo, verdict
from specbench.report.summary import SUMMARY_COLUMNS

HARDWARE = "cpu-amd-epyc-avx512bf16-2c"


def records(prompts: int = 4, datasets=("humaneval",), foreign: float = 0.0, mismatch: bool = False) -> pd.DataFrame:
    """ar at 10 tok/s and pld at about 15 (a little spread per prompt, so the interval has a width); `foreign`:
    other processes' CPU beside ar's rows (the noise guard's disturbed rows); `mismatch`: pld's first turn differs
    from ar's with no near-tie to explain it."""
    rows = []
    for dataset in datasets:
        for p in range(prompts):
            for method, wall in (("ar", 3.0), ("pld", 2.0 + 0.1 * (p % 3))):
                bad = mismatch and method == "pld" and p == 0
                rows.append(dict(method=method, dataset=dataset, prompt_id=str(p), turn=0, new_tokens=30,
                                 wall_s=wall, tokens_per_s=30 / wall, target_forwards=30 if method == "ar" else 20,
                                 drafted=0 if method == "ar" else 20, accepted_drafts=0 if method == "ar" else 10,
                                 peak_mem_mb=100.0, lossless="" if method == "ar" else "mismatch@3" if bad else "match",
                                 mismatch_explained="unexplained" if bad else "", mismatch_logit_gap=5.0 if bad else "",
                                 foreign_cpu=foreign if method == "ar" else 0.0, steal=0.0, hardware=HARDWARE,
                                 device="AMD EPYC 7B13", dtype="float32", model="smollm2-135m"))
    return pd.DataFrame(rows)


META = {"model": {"spec": "smollm2-135m", "name": "SmolLM2-135M-Instruct", "source": "gguf"},
        "environment": {"device": "AMD EPYC 7B13", "device_type": "cpu", "hardware": HARDWARE,
                        "identity": {"kind": "cpu", "vendor": "amd", "name": "AMD EPYC 7B13",
                                     "isa": ["avx2", "avx512bf16"], "cores": 2},
                        "dtype": "float32", "threads": 2, "git": "abc1234"},
        "settings": {"methods": ["ar", "pld"], "datasets": ["humaneval"], "limit": 4, "max_new_tokens": 32,
                     "data_file": None, "drafter": None, "per_category": False, "tree_sizes": [], "temperature": 0.0,
                     "options": {"ar": {}, "pld": {"ngram": 3, "artifact": None}}},
        "complete": True}


def write_run(folder, meta=None, **kwargs):
    folder.mkdir(parents=True, exist_ok=True)
    records(**kwargs).to_csv(folder / "records.csv", index=False)
    (folder / "run.yaml").write_text(yaml.safe_dump(meta or META))
    return folder


def report_lines(folder) -> list[str]:
    run_report.write_run_report(folder)
    return (folder / "report.md").read_text().splitlines()


def test_the_timing_verdict_is_in_the_first_ten_lines(tmp_path):
    quiet = report_lines(write_run(tmp_path / "quiet", prompts=12))
    assert any(line.startswith("**Timing: ok**") for line in quiet[:10]), quiet[:10]
    loud = report_lines(write_run(tmp_path / "loud", prompts=12, foreign=2.0))
    first = "\n".join(loud[:10])
    assert "**Timing: DISTURBED**" in first and "pld on humaneval" in first
    assert "TIMING DISTURBED" in "\n".join(loud)  # the timing check section still says why


def test_one_sentence_per_dataset_with_speedup_interval_lossless_and_timing(tmp_path):
    lines = report_lines(write_run(tmp_path / "r", prompts=12, datasets=("humaneval", "gsm8k")))
    sentences = [line for line in lines[:16] if line.startswith("- On ")]
    assert len(sentences) == 2
    he = sentences[0]
    assert he.startswith("- On 12 humaneval prompts, pld is 1.4") and "x ar (95% interval 1." in he
    assert he.endswith(", lossless, timing ok.")
    assert lines[2].startswith(f"SmolLM2-135M-Instruct on {HARDWARE}, float32")  # the hardware key, not "AMD EPYC"


def test_partial_lossless_failure_and_few_prompts_are_said_up_front(tmp_path):
    meta = {**META, "complete": False}
    lines = report_lines(write_run(tmp_path / "r", meta=meta, prompts=3, mismatch=True))
    head = "\n".join(lines[:12])
    assert "**PARTIAL**" in head and "**Lossless check FAILED**: 1 prompt turn(s) of lossless methods (pld)" in head
    assert "**Few prompts**: humaneval: 3 prompts" in head and "--limit 10" in head
    assert "LOSSLESS CHECK FAILED" in head  # in the dataset's sentence too
    assert "## Lossless check FAILED" in "\n".join(lines)  # the turns, further down


def test_no_caveat_that_does_not_apply(tmp_path):
    text = "\n".join(report_lines(write_run(tmp_path / "r", prompts=12)))
    assert "PARTIAL" not in text and "FAILED" not in text and "Few prompts" not in text


def test_the_interval_straddling_one_is_read_as_such():
    row = pd.Series({"method": "pld", "dataset": "d", "prompts": 12, "speedup": 1.02, "speedup_lo": 0.95,
                     "speedup_hi": 1.1, "tokens_per_s": 10.0, "batch_size": 1})
    assert verdict.speed_phrase(row) == "pld is 1.02x ar (95% interval 0.95-1.10, not distinguishable from ar)"
    batched = row.copy()
    batched["batch_size"], batched["batching"], batched["prompts"] = 4, "unpadded", 8
    assert verdict.speed_phrase(batched).startswith("pld B=4 unpadded is 1.02x ar at B=4")
    assert verdict.units(batched) == 2  # at B > 1 the unit is a batch


def test_compact_table_then_settings_and_environment_last_without_none_or_reprs(tmp_path):
    lines = report_lines(write_run(tmp_path / "r", prompts=12))
    text = "\n".join(lines)
    summary_at = lines.index("## Summary")
    assert lines[summary_at + 2].startswith("| method | dataset | prompts | tok/s | speedup vs ar | 95% interval")
    assert lines[summary_at + 2].endswith("| timing |")
    settings_at, env_at, appendix_at = (lines.index(h) for h in ("## Settings", "## Environment",
                                                                   "## Appendix: every summary column"))
    assert summary_at < settings_at < env_at < appendix_at
    tail = "\n".join(lines[settings_at:appendix_at])
    for repr_ in ("None", "{'", "['", "[]", "{}", "True", "False"):
        assert repr_ not in tail, repr_
    assert "- methods: ar, pld" in tail and "- pld options: ngram 3" in tail and "- per_category: no" in tail
    identity = next(line for line in tail.splitlines() if line.startswith("- identity: "))
    assert f"- hardware: {HARDWARE}" in tail and "isa avx2+avx512bf16" in identity and "vendor amd" in identity
    header = "| " + " | ".join(SUMMARY_COLUMNS) + " |"
    assert text.count(header) == 1 and lines.index(header) > appendix_at  # the 41 columns: the appendix only
    assert list(pd.read_csv(tmp_path / "r" / "summary.csv").columns) == SUMMARY_COLUMNS


def test_plain_values():
    assert runinfo.plain(None) is None and runinfo.plain([]) is None and runinfo.plain({"a": None}) is None
    assert runinfo.plain([1, 2]) == "1, 2" and runinfo.plain(True) == "yes"
    assert runinfo.plain({"tree": "dynamic", "gamma": None, "isa": ["avx2", "amx"]}) == "tree dynamic, isa avx2+amx"


def test_compact_table_marks_disturbed_rows():
    summary = run_report.summarize(records(prompts=4, foreign=2.0))
    table = compact.table(summary)
    assert list(table.columns)[-1] == "timing" and (table.timing == "**DISTURBED**").all()
    assert table.set_index("method").loc["ar", "95% interval"] == "-"  # ar against itself: nothing resampled


def test_report_a_b_warns_on_different_settings_and_keeps_the_timing_column(tmp_path):
    a = write_run(tmp_path / "a", prompts=4)
    other = {**META, "settings": {**META["settings"], "max_new_tokens": 64,
                                  "options": {"ar": {}, "pld": {"ngram": 4}}}}
    b = write_run(tmp_path / "b", meta=other, prompts=4, foreign=2.0)
    result = CliRunner().invoke(app, ["report", str(a), str(b), "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "--max-new-tokens: 64 (b) vs 32 (a)" in said and "pld --ngram: 4 (b) vs 3 (a)" in said
    md = (tmp_path / "cmp" / "summary.md").read_text()
    assert "**Runs differ in settings**: --max-new-tokens: 64 (b) vs 32 (a)" in md
    assert "- a: timing ok" in md and "- b: timing DISTURBED (2 of 2 rows)" in md
    header = next(line for line in md.splitlines() if line.startswith("| run | method |"))
    assert header.endswith("| timing |") and "**DISTURBED**" in md


def test_report_a_b_with_the_same_settings_does_not_warn(tmp_path):
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b")
    result = CliRunner().invoke(app, ["report", str(a), str(b), "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    assert "differ in settings" not in result.output
    assert "differ in settings" not in (tmp_path / "cmp" / "summary.md").read_text()


def test_plot_titles_name_the_hardware_key_and_fall_back_to_the_device_name():
    from specbench.report.titles import plot_title

    assert plot_title(META, records()).startswith(f"SmolLM2-135M-Instruct on {HARDWARE}, float32")
    old = {**META, "environment": {"device": "AMD EPYC 7B13", "dtype": "float32"}}  # a run from before the key
    assert " on AMD EPYC 7B13, " in plot_title(old, records().drop(columns="hardware"))


def test_one_prompt_shows_no_zero_width_interval():
    summary = run_report.summarize(records(prompts=1))
    table = compact.table(summary).set_index("method")
    assert table.loc["pld", "95% interval"] == "n/a (1 prompt)" and table.loc["ar", "95% interval"] == "-"


def test_settings_leave_out_server_options_where_no_server_ran():
    from specbench.report.runinfo import settings_section

    own = {"settings": {"engine": "specbench", "limit": 2, "engine_options": {"concurrency": "1", "timeout": 60.0}}}
    assert not any("concurrency" in line for line in settings_section(own))
    served = {"settings": {**own["settings"], "engine": "openai"}}
    assert any("concurrency" in line for line in settings_section(served))

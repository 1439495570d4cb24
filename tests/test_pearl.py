"""`pearl` and its ablations: the target distribution is preserved when sampling (every exec mode available on
CPU), the pre-/post-verify state machine, the timeline the runner saves, and exec-mode errors. The greedy
lossless test over the registry (test_methods.py) covers pearl, pearl-no-pre and pearl-no-post too."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from specbench.core.verify import Sampling
from specbench.methods.sd.drafter import layer_drafter
from specbench.errors import SpecbenchError
from specbench.methods import get_method

from .conftest import prompt_ids
from .test_sd import check_distribution, with_stop_token


@pytest.mark.parametrize("name,mode", [("pearl", "sequential"), ("pearl", "threads"),
                                       ("pearl-no-pre", "sequential"), ("pearl-no-post", "sequential")])
def test_pearl_sampling_preserves_target_distribution(tiny, name, mode):
    method = get_method(name)(tiny, {"gamma": 2, "pearl_exec": mode}, layer_drafter(tiny, [0]))
    distance = check_distribution(method, tiny, trials=800)
    assert distance < 0.1, f"TV {distance:.3f} between {name} ({mode}) samples and the target distribution"


def test_identical_drafter_stays_in_post_verify(tiny):
    """A drafter equal to the target: after the first pre-verify every step is a post-verify that keeps all."""
    pearl = get_method("pearl")(tiny, {"gamma": 3, "pearl_exec": "sequential"}, layer_drafter(tiny, [0, 1]))
    gen = pearl.generate(prompt_ids(1), 40, Sampling(), None)
    modes = [s["mode"] for s in gen.timeline]
    assert modes[0] == "pre" and set(modes[1:]) == {"post"}
    assert gen.accepted_drafts == gen.drafted
    assert all(s["draft"] and s["target"] for s in gen.timeline)  # both busy in every step


def test_threads_overlap_the_drafter_and_the_target(tiny):
    pearl = get_method("pearl")(tiny, {"gamma": 2, "pearl_exec": "threads"}, layer_drafter(tiny, [0]))
    gen = pearl.generate(prompt_ids(2), 24, Sampling(), None)
    assert pearl.mode == "threads"
    both = [s for s in gen.timeline if s["draft"] and s["target"]]
    assert both and all(s["t0"] <= s["draft"][0] and s["draft"][1] <= s["t1"] + 1e-6 for s in both)


def test_unavailable_exec_mode_is_a_clear_error(tiny):
    with pytest.raises(SpecbenchError, match="streams"):
        get_method("pearl")(tiny, {"gamma": 2, "pearl_exec": "streams"}, layer_drafter(tiny, [0]))
    with pytest.raises(SpecbenchError, match="--pearl-exec"):
        get_method("pearl")(tiny, {"gamma": 2, "pearl_exec": "warp"}, layer_drafter(tiny, [0]))


def test_run_saves_timeline_and_report_section(tmp_path, monkeypatch):
    """specbench run with sd and pearl on a tiny model writes timeline.jsonl, timeline_summary.csv and Gantt PNGs."""
    from typer.testing import CliRunner

    from specbench.cli import app
    from specbench.methods.sd.drafter import save_artifact

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    from specbench.core.model.load import load_model

    tiny = load_model("random:tiny", "float32", "cpu")
    drafter = layer_drafter(tiny, [0])
    save_artifact(drafter.model, tmp_path / "drafter", {"init_layers": [0], "target": tiny.spec,
                                                        "target_fingerprint": tiny.fingerprint()})
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Count from {i} to {i + 9}."}) + "\n" for i in range(2)))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "--model", "random:tiny", "--method", "sd", "--method", "pearl",
                                   "--drafter", str(tmp_path / "drafter"), "--dataset", str(data), "--limit", "2",
                                   "--max-new-tokens", "16", "--warmup", "0", "--gamma", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]
    assert {r["method"] for r in rows} == {"sd", "pearl"} and all(r["steps"] for r in rows)
    assert (out / "timeline_summary.csv").is_file() and (out / "timeline_pearl.png").is_file()
    report = (out / "report.md").read_text()
    assert "mutual_wait_s" in report and "mean_accepted_tokens" in report
    # drafting cost: per record (sd drafts with one drafter forward per draft token), summed in summary.csv
    records = pd.read_csv(out / "records.csv", dtype={"prompt_id": str})
    sd, pearl = (records[records.method == m] for m in ("sd", "pearl"))
    assert (sd.draft_forwards == sd.drafted).all() and (pearl.draft_forwards > 0).all()
    assert (sd.draft_s > 0).all() and (pearl.draft_s > 0).all()
    summary = pd.read_csv(out / "summary.csv").set_index("method")
    assert summary.loc["pearl", "draft_forwards"] == pearl.draft_forwards.sum()
    assert summary.loc["sd", "draft_ms_per_token"] == pytest.approx(
        1e3 * sd.draft_s.sum() / sd.new_tokens.sum(), abs=1e-3)
    assert summary.loc["ar", "draft_forwards"] == 0 and pd.isna(summary.loc["ar", "draft_ms_per_token"])
    chosen = yaml.safe_load((out / "run.yaml").read_text())["chosen"]  # what each method chose, said and kept
    assert chosen["sd"]["gamma"] == 2 and chosen["sd"]["gamma_from"] == "--gamma"
    assert chosen["pearl"]["exec"] in chosen["pearl"]["step_ms_by_exec"] and chosen["pearl"]["c"] > 0
    assert "pearl: drafter" in res.output and "exec " in res.output


def test_timeline_counts_tokens_emitted_after_a_stop_token_cut(tiny):
    """The post-verify step after the first pre-verify keeps 4 tokens, of which the stop token leaves 2."""
    ids = prompt_ids(1)
    free = get_method("ar")(tiny, {}).generate(ids, 8, Sampling(), None).tokens
    assert free[2] not in free[:2]
    pearl = get_method("pearl")(with_stop_token(tiny, free[2]), {"gamma": 4, "pearl_exec": "sequential"},
                                layer_drafter(tiny, [0, 1]))
    gen = pearl.generate(ids, 40, Sampling(), None)
    assert gen.stopped and gen.tokens == free[:3]
    assert [(s["mode"], s["emitted"]) for s in gen.timeline] == [("pre", 1), ("post", 2)]


@pytest.mark.parametrize("name", ["pearl", "pearl-no-pre", "pearl-no-post"])
def test_timeline_emitted_tokens_add_up_under_every_cap(tiny, name):
    """A step can keep more tokens than max_new_tokens leaves room for: the timeline logs what was emitted."""
    pearl = get_method(name)(tiny, {"gamma": 3, "pearl_exec": "sequential"}, layer_drafter(tiny, [0, 1]))
    cut = 0
    for cap in range(1, 12):
        gen = pearl.generate(prompt_ids(1), cap, Sampling(), None)
        assert len(gen.tokens) == cap and sum(s["emitted"] for s in gen.timeline) == cap
        kept = gen.accepted_drafts + sum(s["sampled"] for s in gen.timeline)  # tokens the steps verified
        cut += kept > cap
    assert cut  # some cap did cut a step


def test_auto_exec_compares_modes_at_the_same_gamma():
    """sequential is faster than threads at gamma 2 and at gamma 4; only threads's own gamma (2, from its c) gives it
    a cheaper step than sequential's own (4): raw steps of different gammas would pick threads."""
    from specbench.methods.pearl.scheduler import choose_mode

    mode, reason = choose_mode({"sequential": {2: 5.0, 4: 10.0}, "threads": {2: 6.0, 4: 12.0}},
                               {"sequential": 4, "threads": 2})
    assert mode == "sequential" and "gammas 2, 4" in reason and "same gamma" in reason
    mode, reason = choose_mode({"sequential": {3: 5.0}, "threads": {3: 4.0}}, {"sequential": 3, "threads": 3})
    assert mode == "threads" and "gamma 3" in reason


@pytest.mark.parametrize("threads_at_2,expected", [(4.0, "sequential"), (3.0, "threads")])
def test_auto_exec_scores_per_drafted_token_when_the_ranking_depends_on_gamma(threads_at_2, expected):
    """threads is faster at gamma 2, sequential at gamma 4: each is scored at its own gamma per drafted token
    (sequential 7 / 4 = 1.75 against threads 4 / 2 = 2, or 3 / 2 = 1.5)."""
    from specbench.methods.pearl.scheduler import choose_mode

    mode, reason = choose_mode({"sequential": {2: 5.0, 4: 7.0}, "threads": {2: threads_at_2, 4: 9.0}},
                               {"sequential": 4, "threads": 2})
    assert mode == expected and "per drafted token" in reason and "sequential 4, threads 2" in reason


def test_auto_exec_calibration_times_every_mode_at_the_gamma_the_run_uses(tiny, monkeypatch):
    """With c = 4 in sequential and 2 in threads, both modes are timed at gammas 2 and 4; the run then uses the
    chosen mode's gamma, and chosen() says what was compared."""
    import dataclasses
    import threading

    import specbench.methods.pearl.scheduler as concurrency

    def forward_times(model, device, widths=(1,), context=64, rounds=7):
        in_worker = threading.current_thread().name.startswith("specbench-draft")
        return {1: 4.0 if model is tiny.model else (2.0 if in_worker else 1.0)}

    timed = []

    def step_cost(executor, target, drafter_model, gamma, reps=3):
        timed.append((executor.mode, gamma))
        return {("sequential", 2): 5.0, ("sequential", 4): 10.0, ("threads", 2): 6.0, ("threads", 4): 12.0}[
            (executor.mode, gamma)]

    monkeypatch.setattr(concurrency, "measure_forward_times", forward_times)
    monkeypatch.setattr(concurrency, "_pearl_step_cost", step_cost)
    target = dataclasses.replace(tiny, extras={})  # no memoised calibration
    pearl = get_method("pearl")(target, {"pearl_exec": "auto"}, layer_drafter(tiny, [0]))
    assert sorted(timed) == [("sequential", 2), ("sequential", 4), ("threads", 2), ("threads", 4)]
    assert pearl.mode == "sequential" and pearl.gamma == 4 and pearl.executor.mode == "sequential"
    chosen = pearl.chosen()
    assert chosen["c_by_exec"] == {"sequential": 4.0, "threads": 2.0}
    assert chosen["gamma"] == 4 and chosen["gamma_from"] == "round(c) of sequential"
    assert chosen["step_ms_by_exec"]["threads"] == {2: 6000.0, 4: 12000.0}
    assert "same gamma" in chosen["exec_from"] and "streams" in chosen["exec_not_compared"]


@pytest.mark.parametrize("mode,steps,expect", [
    ("streams", {"sequential": {9: 0.0349}, "streams": {9: 0.0338}},
     "hardly overlapped here (streams 33.8 ms against 34.9 ms sequential a step, 3% saved) at gamma 9"),
    ("sequential", {"sequential": {9: 0.030}, "threads": {9: 0.036}},
     "no concurrent mode beat sequential here (threads 36.0 ms against 30.0 ms a step) at gamma 9"),
    ("threads", {"sequential": {9: 0.040}, "threads": {9: 0.025}}, None),  # real overlap: nothing to say
    ("streams", {"streams": {9: 0.030}}, None),  # --pearl-exec streams: nothing was compared
])
def test_a_run_is_told_when_drafting_and_verifying_hardly_overlap(mode, steps, expect):
    """PEARL's gain needs the drafter beside the target; when calibration measured the chosen mode's step within
    10% of the sequential one (one GPU's streams on the H200) or no concurrent mode beat sequential, the run says so
    and what PEARL is built for."""
    from specbench.methods.pearl.scheduler import Calibration, overlap_note

    note = overlap_note(Calibration(mode, "", 9, 8.5, steps, {}, {}))
    if expect is None:
        assert note is None
    else:
        assert expect in note and "--draft-device" in note

"""`pearl` and its ablations: the target distribution is preserved when sampling (every exec mode available on
CPU), the pre-/post-verify state machine, the timeline the runner saves, and exec-mode errors. The greedy
lossless test over the registry (test_methods.py) covers pearl, pearl-no-pre and pearl-no-post too."""

from __future__ import annotations

import json

import pytest
import yaml

from specbench.core.verify import Sampling
from specbench.drafters.token_drafter import layer_drafter
from specbench.errors import SpecbenchError
from specbench.methods import get_method

from .conftest import prompt_ids
from .test_sd import check_distribution


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
    from specbench.drafters.token_drafter import save_artifact

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    from specbench.core.models import load_model

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
    chosen = yaml.safe_load((out / "run.yaml").read_text())["chosen"]  # what each method chose, said and kept
    assert chosen["sd"]["gamma"] == 2 and chosen["sd"]["gamma_from"] == "--gamma"
    assert chosen["pearl"]["exec"] in chosen["pearl"]["step_ms_by_exec"] and chosen["pearl"]["c"] > 0
    assert "pearl: drafter" in res.output and "exec " in res.output

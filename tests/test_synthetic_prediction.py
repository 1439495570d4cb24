"""--synthetic-acceptance with a folder (each method its own acceptance file) and report.md's "Synthetic acceptance:
measured vs plan": plan's prediction on the run's curve and stated acceptance beside each measured speedup, its error
split into tau and step cost, or the command that takes the missing profile."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from specbench.core.synthetic import PerMethodAcceptance, read_stated, stated_for
from specbench.errors import SpecbenchError
from specbench.report import synthetic_prediction

from .test_synthetic_acceptance import _run  # a `run --synthetic-acceptance` of random:tiny, 3 prompts

PER_RANK = [[0.8, 0.1], [0.6, 0.1], [0.4, 0.1]]


def _folder(tmp_path, *families):
    folder = tmp_path / "published"
    folder.mkdir()
    for i, family in enumerate(families):
        rows = [[round(r[0] - 0.1 * i, 2), r[1]] for r in PER_RANK]  # each file its own rates
        (folder / f"{family}.yaml").write_text(yaml.safe_dump({
            "method": family, "per_rank": rows, "published": {"measured": {"speedup": 2.0 + i / 10, "gpu": "A100"}}}))
    (folder / "README.md").write_text("not an acceptance file")
    return folder


def test_a_folder_states_each_methods_own_acceptance(tmp_path):
    stated = read_stated(str(_folder(tmp_path, "medusa", "ppd")))
    assert isinstance(stated, PerMethodAcceptance) and sorted(stated.profiles) == ["medusa", "ppd"]
    assert stated_for(stated, "medusa").conditional == [0.8, 0.6, 0.4]
    assert stated_for(stated, "ppd").conditional == pytest.approx([0.7, 0.5, 0.3])
    with pytest.raises(SpecbenchError, match="no eagle.yaml or eagle.json"):
        stated_for(stated, "eagle")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SpecbenchError, match="no acceptance file"):
        read_stated(str(empty))


def test_a_folder_without_a_methods_file_stops_the_run_before_loading(tmp_path, prompts_file):
    out, result = _run(tmp_path, prompts_file, str(_folder(tmp_path, "ppd")), "medusa")
    assert result.exit_code != 0 and "no medusa.yaml" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_plan_beside_each_measured_speedup(tmp_path, prompts_file, monkeypatch):
    from .test_auto_tree import write_profile

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    write_profile(tmp_path)
    out, result = _run(tmp_path, prompts_file, str(_folder(tmp_path, "medusa", "ppd")), "medusa", "ppd")
    assert result.exit_code == 0, result.output
    meta = yaml.safe_load((out / "run.yaml").read_text())
    block = meta["synthetic_acceptance"]
    assert set(block["per_method"]) == {"medusa", "ppd"} and all(c["agrees"] for c in block["checks"].values())
    assert block["per_method"]["ppd"]["conditional"] == pytest.approx([0.7, 0.5, 0.3])
    text = (out / "report.md").read_text()
    assert "**Synthetic acceptance**" in "\n".join(text.splitlines()[:6])
    assert synthetic_prediction.TITLE in text
    frame = pd.read_csv(out / "synthetic_prediction.csv")
    assert set(frame.method) == {"medusa", "ppd"}
    assert frame["plan speedup"].gt(0).all() and frame["plan tau"].gt(1).all()
    assert (frame["tree (plan)"] == frame["tree (run)"]).all()  # priced at the run's tree size
    # the two parts multiply back to the decode speedup's ratio to plan's
    ratio = frame["decode speedup"] / frame["plan speedup"]
    assert (frame["tau part"] * frame["cost part"]).to_numpy() == pytest.approx(ratio.to_numpy(), rel=0.02)
    assert frame["paper"].str.contains("A100").all()
    assert (out / "plan" / "plan.yaml").exists()


def test_without_a_profile_the_section_says_the_command_that_takes_one():
    meta = {"synthetic_acceptance": {"given": "0.8,0.6"}, "environment": {"dtype": "bfloat16"},
            "settings": {"methods": ["ar", "ppd"], "model": "random:qwen2.5-0.5b", "dtype": "bfloat16"}}
    summary = pd.DataFrame({"method": ["ar", "ppd"], "dataset": ["d", "d"], "batch_size": [1, 1]})
    text = "\n".join(synthetic_prediction.section(None, summary, pd.DataFrame(), meta))
    assert "specbench profile --model random:qwen2.5-0.5b --dtype bfloat16" in text
    assert synthetic_prediction.section(None, summary, pd.DataFrame(), {}) == []  # not a synthetic run

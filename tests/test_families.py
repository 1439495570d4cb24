"""The family declarations (specbench/families/): every family is declared once and read from there, and a tree
family from a folder outside specbench (tests/toy_family/) goes through estimate, build-tree, plan and run once its
declaration is registered."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from specbench import families
from specbench.cli import app
from specbench.methods import REGISTRY, add_family
from specbench.train.configs import CONFIGS

PACKAGE = Path(__file__).resolve().parent.parent / "specbench"


def test_every_registered_method_belongs_to_a_declared_family_of_its_kind():
    for name, cls in REGISTRY.items():
        family = families.find(cls.family or name.split("-")[0])
        assert family is not None, f"{name}: no declared family"
        assert cls.__module__ == family.methods, f"{name} is registered outside {family.methods}"
        assert cls.kind == family.kind, name
        if family.tree:
            assert cls.one_state == family.one_state, name


def test_train_commands_are_the_families_configs():
    assert [cls.command for cls in CONFIGS] == [families.load(f.train_config).command for f in families.trained()]
    for cls in CONFIGS:
        assert families.find(cls.command).train_config.endswith(":" + cls.__name__)


def test_tree_file_prefixes_come_from_the_declaration():
    assert families.tree_stem("ppd", "cpu-x-float32") == "cpu-x-float32"  # the first family's trees: no prefix
    assert families.tree_stem("eagle", "cpu-x-float32") == "eagle-cpu-x-float32"
    assert families.method_flag(families.DEFAULT_TREE_FAMILY) == "" and families.method_flag("medusa") == \
        " --method medusa"


def test_cost_laws():
    assert families.get("eagle").cost_law(2.0)(3) == 6.0  # one drafter forward per depth
    assert families.get("parallelspec").cost_law(2.0)(3) == 2.0  # one forward a step
    assert not families.get("ppd").drafts_with_model and families.get("medusa").drafts_with_model


def test_no_family_is_named_outside_its_folder_and_declaration():
    """Planning, train, the store and the CLI read declarations: no comparison with a tree family's name and no
    per-family table outside specbench/methods/ and specbench/families/."""
    names = "|".join(re.escape(n) for n in families.tree_families())
    compared = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["']({names})["']|["']({names})["']\s*(==|!=)|"""
                          rf"""^\s*["']({names})["']\s*:""")
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(("methods/", "families/")):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if compared.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "family names compared or tabled outside methods/ and families/:\n" + "\n".join(found)


@pytest.fixture
def toy():
    """The toy family registered for one test: its declaration and its methods, removed afterwards."""
    from tests.toy_family.family import TOY

    add_family(TOY)
    yield TOY
    families.FAMILIES.pop(TOY.name, None)
    REGISTRY.pop("toy", None)
    sys.modules.pop(TOY.methods, None)


def sb(*args: str) -> str:
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    return " ".join(res.output.split())


def test_a_tree_family_from_its_own_folder_runs_through_estimate_build_tree_plan_and_run(toy, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"instruction": f"Tell me about item {i} and why."})
                                                    + "\n" for i in range(3)))
    model = "random:tiny"
    sb("estimate", "--method", "toy", "--model", model, "--dataset", "prompts.jsonl", "--limit", "2",
       "--max-new-tokens", "12")
    accepted = yaml.safe_load((tmp_path / "acceptance" / "tiny" / "toy.yaml").read_text())
    assert accepted["method"] == "toy" and len(accepted["per_rank"]) == 2  # two prompt tokens, two distances

    sb("build-tree", "--method", "toy", "--model", model, "--gpu", "a100", "--prompt-tokens", "2",
       "--max-size", "8")
    tree = yaml.safe_load((tmp_path / "trees" / "tiny" / "toy-a100-bfloat16.yaml").read_text())  # its prefix
    assert tree["method"] == "toy" and sorted(tree["states"]) == [1, 2]  # a dynamic tree over 2 prompt tokens

    said = sb("plan", "--model", model, "--gpu", "a100", "--acceptance", "acceptance/tiny", "--methods", "toy",
              "--out", "plan")
    planned = yaml.safe_load((tmp_path / "plan" / "plan.yaml").read_text())
    row = planned["methods"][0]
    assert row["method"] == "toy" and row["size"] >= 2 and row["speedup"] > 0, said
    assert row["memory_gb"]["kv"] > 0 and "draft_ms" not in row  # its guesses ride in the target's forward

    said = sb("run", "--method", "toy", "--model", model, "--dataset", "prompts.jsonl", "--limit", "1",
              "--max-new-tokens", "6", "--warmup", "0", "--dtype", "float32", "--out", "run")
    meta = yaml.safe_load((tmp_path / "run" / "run.yaml").read_text())
    assert "toy" in meta["trees"]
    assert "--method toy" in said  # no tree for this CPU: the note names the family's own build-tree command
    assert "100%" in said  # lossless against ar

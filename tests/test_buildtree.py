"""`specbench build-tree`: hardware-aware size choice, tree files, and bad input."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.tree_file import read_tree_file
from specbench.planning.profile import LatencyProfile

from .test_treesearch import VICUNA7B

cli = CliRunner()


@pytest.fixture
def acceptance(tmp_path):
    path = tmp_path / "ppd.yaml"
    path.write_text(yaml.safe_dump({"per_rank": VICUNA7B}))
    return path


def build(tmp_path, acceptance, gpu, *extra):
    out = tmp_path / f"{gpu.replace('/', '_')}.yaml"
    result = cli.invoke(app, ["build-tree", "--model", "random:llama2-7b", "--gpu", gpu, "--acceptance",
                              str(acceptance), "--max-size", "48", "--out", str(out), *extra])
    return result, out


def test_chosen_size_follows_the_latency_curve(tmp_path, acceptance):
    flat = LatencyProfile("llama2-7b", "bfloat16", "flat-gpu", "measured", [1, 64],
                          {512: {"median_ms": [10.0, 10.0], "p10_ms": [10.0, 10.0], "p90_ms": [10.0, 10.0]}})
    steep = LatencyProfile("llama2-7b", "bfloat16", "slow-cpu", "measured", [1, 8, 64],
                           {512: {"median_ms": [10.0, 20.0, 120.0], "p10_ms": [0] * 3, "p90_ms": [0] * 3}})
    sizes = {}
    for prof in (flat, steep):
        path = tmp_path / f"{prof.hardware}.yaml"
        path.write_text(prof.to_yaml())
        result, out = build(tmp_path, acceptance, str(path))
        assert result.exit_code == 0, result.output
        tree = read_tree_file(out)
        sizes[prof.hardware] = tree.size
        assert tree.predicted_tau > 1 and tree.extra["curves"]["size"][0] == 2
        assert out.with_suffix(".png").exists()
    assert sizes["flat-gpu"] > sizes["slow-cpu"]  # a flat curve admits a far larger tree


def test_a_search_that_ends_at_the_edge_of_its_range_warns(tmp_path, acceptance):
    from types import SimpleNamespace

    from specbench.planning.buildtree import edge_note

    flat = LatencyProfile("llama2-7b", "bfloat16", "flat-gpu", "measured", [1, 64],
                          {512: {"median_ms": [10.0, 10.0], "p10_ms": [10.0, 10.0], "p90_ms": [10.0, 10.0]}})
    path = tmp_path / "flat.yaml"
    path.write_text(flat.to_yaml())
    result, out = build(tmp_path, acceptance, str(path), "--max-size", "12")  # still rising at 12
    said = " ".join(result.output.split())
    assert result.exit_code == 0 and "warning" in said and "is the largest searched" in said, said
    assert "--max-size 24" in said
    inside = SimpleNamespace(sizes=[2, 3, 4], best=SimpleNamespace(size=3))
    assert edge_note(inside, 4) == ""  # the curve turned down inside the range


def test_preset_estimates_are_labelled(tmp_path, acceptance):
    result, out = build(tmp_path, acceptance, "h100")
    assert result.exit_code == 0, result.output
    assert "estimated" in result.output
    assert read_tree_file(out).source == "estimated"


@pytest.mark.parametrize("args, message", [
    (["--gpu", "tpu9"], "unknown --gpu"),
    (["--max-size", "2", "--prompt-tokens", "3"], "smaller than the 3 prompt tokens"),
    (["--acceptance", "/nonexistent/ppd.yaml"], "specbench estimate"),
])
def test_bad_build_tree_input(tmp_path, acceptance, args, message):
    base = ["build-tree", "--model", "random:llama2-7b", "--gpu", "a100", "--acceptance", str(acceptance),
            "--out", str(tmp_path / "t.yaml")]
    result = cli.invoke(app, base + args)
    assert result.exit_code != 0 and message in result.output


def test_malformed_profile_and_acceptance(tmp_path, acceptance):
    bad_profile = tmp_path / "bad-profile.yaml"
    bad_profile.write_text("kind: latency-profile\nmodel: x\n")
    result, _ = build(tmp_path, acceptance, str(bad_profile))
    assert result.exit_code != 0 and "missing field" in result.output
    bad_acc = tmp_path / "bad-acc.yaml"
    bad_acc.write_text("per_rank: [[2.0, -1]]\n")
    result, _ = build(tmp_path, bad_acc, "a100")
    assert result.exit_code != 0 and "per_rank" in result.output

"""Per-batch-size choices (issue 28, item 4): build-tree --batch-size B, `--tree auto` and `--gamma auto` per batch
size from the profile's L(B, w); batch 1's choice with a note when the profile lacks B; per-B tree files never
overwrite batch 1's."""

from __future__ import annotations

import pytest
import torch
import yaml
from typer.testing import CliRunner

from specbench.methods.sd.drafter import layer_drafter
from specbench.cli import app
from specbench.core.machine.hardware import hardware_slug
from specbench.core.profile_file import BatchCurve, LatencyProfile
from specbench.core.tree_file import other_trees, read_tree_file
from specbench.core.verify import Sampling
from specbench.methods import get_method
from specbench.progress import console

from .conftest import artifact_options, prompt_ids
from .test_auto_tree import write_acceptance
from .test_treesearch import VICUNA7B

HW = hardware_slug(torch.device("cpu"))
WIDTHS = [1, 2, 4, 8, 16, 32, 64]
FLAT = [10.0, 10.2, 10.4, 10.8, 11.5, 13.0, 16.0]  # batch 1: nearly flat, trees pay


def steep(b: int) -> list[float]:
    """L(B, w) of a batch that fills the hardware: every row's extra token costs (grows with B)."""
    return [10.0 * b * (1 + 0.5 * (w - 1)) for w in WIDTHS]


def profile(batch_sizes=(4,), model="tiny") -> LatencyProfile:
    curve = {512: {"median_ms": FLAT, "p10_ms": FLAT, "p90_ms": FLAT}}
    batches = {b: BatchCurve(WIDTHS, {512: {"median_ms": steep(b), "p10_ms": steep(b), "p90_ms": steep(b)}})
               for b in batch_sizes}
    return LatencyProfile(model, "float32", HW, "measured", WIDTHS, curve, {}, batches)


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the store's first root (core/store.py: cwd, then the checkout)
    return tmp_path


def write_profile(root, prof: LatencyProfile):
    path = root / "profiles" / HW / f"{prof.model}-float32.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.to_yaml())
    return path


# ------------------------------------------------------------------ build-tree --batch-size


def test_build_tree_at_a_batch_size_chooses_a_smaller_tree_and_files_it_apart(tmp_path):
    acc = tmp_path / "ppd.yaml"
    acc.write_text(yaml.safe_dump({"per_rank": VICUNA7B}))
    prof = tmp_path / "prof.yaml"
    prof.write_text(profile().to_yaml())
    sizes = {}
    for b in (1, 4):
        out = tmp_path / "trees" / f"b{b}.yaml"
        result = CliRunner().invoke(app, ["build-tree", "--model", "random:llama2-7b", "--gpu", str(prof),
                                          "--acceptance", str(acc), "--max-size", "32", "--batch-size", str(b),
                                          "--out", str(out)])
        assert result.exit_code == 0, result.output
        tree = read_tree_file(out)
        sizes[b] = tree.size
        assert (tree.extra.get("batch_size") == 4) == (b == 4)
    assert sizes[4] < sizes[1]  # L(4, w) grows with w where L(1, w) is flat: every extra candidate costs 4 rows
    assert "at batch size 4" in result.output
    missing = CliRunner().invoke(app, ["build-tree", "--model", "random:llama2-7b", "--gpu", str(prof),
                                       "--acceptance", str(acc), "--batch-size", "8", "--out", str(tmp_path / "x.yaml")])
    assert missing.exit_code != 0 and "has no batch size 8" in " ".join(missing.output.split())
    assert "--batch-size 1,8" in " ".join(missing.output.split()) and "Traceback" not in missing.output


def test_build_tree_default_path_keeps_batch_ones_file(store_dir):
    write_profile(store_dir, profile(model="llama2-7b"))
    acc = store_dir / "acc.yaml"
    acc.write_text(yaml.safe_dump({"per_rank": VICUNA7B}))
    for b in ("1", "4"):
        result = CliRunner().invoke(app, ["build-tree", "--model", "random:llama2-7b", "--gpu", "cpu", "--dtype",
                                          "float32", "--acceptance", str(acc), "--max-size", "24", "--batch-size", b])
        assert result.exit_code == 0, result.output
    folder = store_dir / "trees" / "llama2-7b"
    assert (folder / f"{HW}-float32.yaml").is_file() and (folder / f"{HW}-float32-b4.yaml").is_file()
    assert read_tree_file(folder / f"{HW}-float32.yaml").size > read_tree_file(folder / f"{HW}-float32-b4.yaml").size
    assert other_trees("llama2-7b", "ppd", HW, "float32") == []  # its own per-B file is not "another hardware's"


def test_preset_gpus_estimate_the_batch_curve():
    from specbench.planning.latency_estimate import estimate_profile

    from .test_profile import _config

    prof = estimate_profile("llama2-7b", _config("llama2-7b"), "a100", "bfloat16", [1, 4, 16], [512],
                            batch_sizes=[1, 64])
    one, big = prof.at_batch(1), prof.at_batch(64)
    assert prof.batch_sizes == [1, 64]
    assert big.latency_ms(16, 512) / big.latency_ms(1, 512) > one.latency_ms(16, 512) / one.latency_ms(1, 512)


# ------------------------------------------------------------------ --tree auto per batch size at run time


def make(name, tiny):
    with console.capture() as said:
        method = get_method(name)(tiny, artifact_options(name, tiny))
    return method, said


def plan(method, sizes):
    with console.capture() as said:
        method.choose_per_batch_size(sizes)
    return " ".join(said.get().split())


def test_tree_auto_per_batch_size_builds_uses_and_switches(tiny, store_dir):
    write_profile(store_dir, profile(batch_sizes=(4,)))
    write_acceptance(store_dir, "ppd")
    method, _ = make("ppd", tiny)
    one = method.tree_file
    said = plan(method, [2, 4])
    b4 = store_dir / "trees" / "tiny" / f"{HW}-float32-b4.yaml"
    assert b4.is_file() and "built it now from L(B=4, w)" in said
    assert method.trees[4].tree_file.size < one.size  # steep L(4, w): a smaller tree
    # the profile has no batch size 2: batch 1's tree, and the note names the command that measures it
    assert method.trees[2] is method.trees[1]
    assert "batch size 2 decodes with batch 1's tree" in said and "--batch-size 1,2" in said
    assert method.tree_file is one  # planning leaves batch 1's tree active
    method.start_batch("unpadded", 4)
    assert method.tree_file is method.trees[4].tree_file and method.layouts is method.trees[4].layouts
    gen = method.generate(prompt_ids(0), 8, Sampling(), None)
    assert len(gen.tokens) == 8 and method.tree_file is one  # batch 1 decodes with batch 1's tree
    chosen = method.chosen()["tree_per_batch_size"]
    assert chosen[1]["size"] == one.size and chosen[4]["from"] == "L(B, w)" and chosen[2]["from"] == "batch 1"
    again, _ = make("ppd", tiny)
    assert "built it now" not in plan(again, [4])  # the next run finds the filed tree
    assert again.trees[4].tree_file.size == method.trees[4].tree_file.size


def test_fixed_trees_are_not_chosen_per_batch_size(tiny, store_dir):
    write_profile(store_dir, profile(batch_sizes=(4,)))
    write_acceptance(store_dir, "ppd")
    method = get_method("ppd")(tiny, {**artifact_options("ppd", tiny), "tree": "size=6"})
    plan(method, [4])
    assert set(method.trees) == {1} and not (store_dir / "trees").exists()


def test_batched_ppd_with_its_batch_tree_equals_batch_one_ar(tiny, store_dir):
    from specbench.methods.batch_loop import generate_batch

    write_profile(store_dir, profile(batch_sizes=(3,)))
    write_acceptance(store_dir, "ppd")
    method, _ = make("ppd", tiny)
    plan(method, [3])
    prompts = [prompt_ids(i, length=12 + i) for i in range(3)]
    ar = get_method("ar")(tiny)
    reference = [ar.generate(p, 20, Sampling(), None).tokens for p in prompts]
    gens, _ = generate_batch(method, prompts, 3, "unpadded", False, 20, Sampling(), [None] * 3)
    assert [g.tokens for g in gens] == reference


# ------------------------------------------------------------------ --gamma auto per batch size (sd)


def test_sd_gamma_per_batch_size(tiny, store_dir):
    write_profile(store_dir, profile(batch_sizes=(4,)))
    sd = get_method("sd")(tiny, {}, layer_drafter(tiny, [0]))
    said = plan(sd, [2, 4])
    assert sd.batch_gammas[4] == 1 <= sd.gamma  # L(4, w) grows by half a step per token: one draft at most pays
    assert sd.batch_gammas[2] == sd.gamma and "--batch-size 1,2" in said  # no L(2, w): batch 1's gamma
    assert sd.chosen()["gamma_per_batch_size"] == {1: sd.gamma, 2: sd.gamma, 4: 1}
    sd.start_batch("unpadded", 4)
    assert sd.batch_gamma == 1
    fixed = get_method("sd")(tiny, {"gamma": 3}, layer_drafter(tiny, [0]))
    plan(fixed, [4])
    assert fixed.batch_gammas == {1: 3} and "gamma_per_batch_size" not in fixed.chosen()

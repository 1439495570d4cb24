"""`--tree auto` means auto (issue 29, item 1): without a tree file for this hardware, a tree method builds it at
once from this hardware's profile and its own acceptance file (build-tree's code), files it where build-tree would
and says so; without a profile or acceptance file, the note names the commands that make them for that method."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from specbench.core.machine.hardware import hardware_slug
from specbench.core.profile_file import load_profile
from specbench.planning.profile import LatencyProfile
from specbench.progress import console

from .conftest import artifact_options

HW = hardware_slug(torch.device("cpu"))
PER_RANK = [[0.6, 0.1, 0.05], [0.4, 0.1, 0.05], [0.3, 0.1, 0.05], [0.2, 0.1, 0.05], [0.1, 0.05, 0.05],
            [0.1, 0.05, 0.05]]


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    """An empty working directory: the store's first root (core/store.py: cwd, then the checkout)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_profile(root, model="tiny", dtype="float32"):
    flat = [10.0, 10.5, 11.0, 12.0, 14.0, 18.0, 26.0]
    prof = LatencyProfile(model, dtype, HW, "measured", [1, 2, 4, 8, 16, 32, 64], {512: {"median_ms": flat}})
    path = root / "profiles" / HW / f"{model}-{dtype}.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(prof.to_yaml())
    return path


def write_acceptance(root, family, model="tiny"):
    path = root / "acceptance" / model / f"{family}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"method": family, "per_rank": PER_RANK}))
    return path


def make(name, tiny):
    from specbench.methods import get_method

    with console.capture() as said:
        method = get_method(name)(tiny, artifact_options(name, tiny))
    return method, " ".join(said.get().split())


@pytest.mark.parametrize("name", ["eagle", "medusa", "ppd"])
def test_auto_builds_files_and_then_reuses_this_hardwares_tree(name, tiny, store_dir):
    from specbench.methods import get_method

    family = get_method(name).family
    write_profile(store_dir)
    acc = write_acceptance(store_dir, family)
    tree = store_dir / "trees" / "tiny" / (f"{HW}-float32.yaml" if family == "ppd" else f"{family}-{HW}-float32.yaml")
    assert not tree.exists()
    method, said = make(name, tiny)
    assert tree.is_file()  # filed where build-tree files it
    assert "built it now" in said and str(tree.relative_to(store_dir)) in said
    data = yaml.safe_load(tree.read_text())
    assert data["method"] == family and data["hardware"] == HW and Path(data["acceptance"]).resolve() == acc.resolve()
    assert method.tree_source == str(tree) and method.tree_file.size == data["size"]
    again, said = make(name, tiny)  # a second run finds the filed tree
    assert "built it now" not in said and again.tree_source == str(tree)


def test_without_a_profile_the_note_names_this_methods_commands(tiny, store_dir):
    # other methods' files (a ppd acceptance file, a medusa tree for other hardware) must not be named
    write_acceptance(store_dir, "ppd")
    other = store_dir / "trees" / "tiny" / "medusa-cpu-other-2c-float32.yaml"
    other.parent.mkdir(parents=True)
    other.write_text("method: medusa\nstates:\n  0:\n    - [[0], 0]\n")
    mine = store_dir / "trees" / "tiny" / "eagle-cpu-other-2c-float32.yaml"
    mine.write_text("method: eagle\nhardware: cpu-other-2c\nstates:\n  0:\n    - [[0], 0]\n")
    method, said = make("eagle", tiny)
    assert method.tree_file.size == 16 and not (store_dir / "trees" / "tiny" / f"eagle-{HW}-float32.yaml").exists()
    assert "`specbench profile --model random:tiny --dtype float32 --device cpu`" in said
    assert "`specbench estimate --method eagle --model random:tiny`" in said
    assert "`specbench build-tree --model random:tiny --method eagle --gpu cpu --dtype float32`" in said
    assert "eagle-cpu-other-2c-float32.yaml" in said  # this method's tree of other hardware: named, not used
    assert "medusa" not in said and "ppd" not in said
    assert "specbench profile" in method.tree_source and "eagle" in method.tree_source

    write_acceptance(store_dir, "eagle")  # with the acceptance file only the profile is missing
    _, said = make("eagle", tiny)
    assert "specbench profile" in said and "specbench estimate" not in said and "--method eagle" in said


def test_gamma_auto_means_the_method_chooses():
    from specbench.methods.sd.drafting import GAMMA

    assert GAMMA.check("auto") is None and GAMMA.check("3") == 3


@pytest.mark.parametrize("name", ["eagle", "medusa"])
def test_a_tree_built_by_a_run_is_priced_with_the_drafter_timed_there(name, tiny, store_dir, monkeypatch):
    """A drafting method's tree that `--tree auto` builds is priced with one drafting forward timed on the run's own
    device and dtype (DraftPricing.ms_here), not the acceptance file's time moved from the machine `estimate` ran
    on: the tree file says which time it used, and the run's predicted
    speedup uses the same time for this machine's profile (another machine's is still priced from the file): the
    time chosen changes the tree."""
    from specbench.methods import get_method
    from specbench.methods.tree.pricing import DraftPricing

    guesser = get_method(name).guesser_type
    prof = write_profile(store_dir)
    acc = write_acceptance(store_dir, guesser.family)
    data = yaml.safe_load(acc.read_text())
    # 6 rows, but the test's medusa has 3 heads: its tree stays 3 deep (deeper would be refused by the run)
    acc.write_text(yaml.safe_dump({**data, "dtype": "float32", "draft_forward_ms": 0.001,
                                   "draft_forward_hardware": "cpu-elsewhere-2c"}))
    tree = store_dir / "trees" / "tiny" / f"{guesser.family}-{HW}-float32.yaml"
    sizes = {}
    for ms in (0.001, 40.0):  # nearly free, then dearer than four target forwards
        monkeypatch.setattr(guesser.proposer_type, "time_drafting", lambda self, tree, acceptance, ms=ms: ms)
        monkeypatch.setattr(DraftPricing, "clock", lambda self: 1.0)  # the time as given (test_draft_pricing scales)
        tree.unlink(missing_ok=True)
        method, said = make(name, tiny)
        sizes[ms] = method.tree_file.size
        assert method.tree_file.tree(0).depth <= method.rows
        assert f"timed on {HW} float32 as the tree was built: {ms:.2f} ms" in said
        filed = yaml.safe_load(tree.read_text())
        assert f"{ms:.2f} ms" in filed["draft_cost"] and filed["draft_forward_ms"] == pytest.approx(ms)
        assert method.draft_cost(load_profile(prof))(1) == pytest.approx(ms)  # the run's predicted speedup
    # eagle pays per depth, so a dearer drafter keeps its tree shallow; medusa pays once a step, so a dearer step
    # makes a wider verify relatively cheaper and its tree grows
    assert sizes[40.0] < sizes[0.001] if name == "eagle" else sizes[40.0] > sizes[0.001]
    elsewhere = LatencyProfile("tiny", "float32", "cpu-elsewhere-2c", "measured", [1, 2], {512: {"median_ms": [10.0, 11.0]}})
    assert method.draft_cost(elsewhere)(1) == pytest.approx(0.001)  # another machine: the file's time


def test_the_drafter_is_timed_once_and_not_at_all_where_guesses_ride_in_the_forward(tiny, store_dir):
    eagle, _ = make("eagle", tiny)
    first = eagle.pricing.ms_here()
    assert first > 0 and eagle.pricing.ms_here() == first  # one measurement per method
    ppd, _ = make("ppd", tiny)
    assert ppd.pricing.ms_here() is None

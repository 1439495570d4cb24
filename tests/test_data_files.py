"""Nothing steers a run unseen: every profile, tree, acceptance file and recommendation a run reads is named in
run.yaml and report.md with its source and flags; a profile or tree measured on a disturbed machine is skipped (said
in one line) unless --allow-disturbed-profile; commands never file into a source checkout unasked; `specbench list
profiles|trees` shows what a run here would take; a compiled run reads the compiled profile (core/lookup.py)."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core import lookup, store

from .test_auto_tree import HW, write_acceptance, write_profile


def sb(*args, code: int = 0) -> str:
    res = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})  # table cells on one line
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    return " ".join(res.output.split())


@pytest.fixture
def here(tmp_path, monkeypatch):
    """An empty working directory with its own user cache and one prompt."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(lookup.ALLOW_ENV, raising=False)  # conftest allows disturbed profiles for the rest
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "count 1 2 3 1 2 3 1 2 3"}) + "\n")
    lookup.start()
    return tmp_path


def disturb(path):
    """Mark a profile as `specbench profile` marks one measured beside other work."""
    data = yaml.safe_load(path.read_text())
    data["contention"] = {"foreign_cpu": 0.93, "steal": 0.0, "disturbed": True}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


RUN = ("run", "--model", "random:tiny", "--dtype", "float32", "--method", "ar", "--dataset", "p.jsonl",
       "--max-new-tokens", 6, "--warmup", 0, "--limit", 1)


def test_a_disturbed_profile_in_the_working_directory_is_not_used_silently(here):
    profile = disturb(write_profile(here))
    # the curve dips below L(1): used, it would lower the noise guard's floor
    data = yaml.safe_load(profile.read_text())
    data["curves"][0]["median_ms"][1] = 5.0
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    rel = f"profiles/{HW}/tiny-float32.yaml"

    said = sb(*RUN, "--out", "quiet")
    assert f"skipped profile {rel} (working directory; disturbed)" in said
    assert "--allow-disturbed-profile uses it" in said
    meta = yaml.safe_load((here / "quiet" / "run.yaml").read_text())
    assert meta["noise_guard"] == {"latency_floor": 1.0, "profile": None}
    assert [s["path"] for s in meta["data_files"]["skipped"]] == [rel]
    assert "0.93 cores" in meta["data_files"]["skipped"][0]["why"]
    assert not [u for u in meta["data_files"]["used"] if u["kind"] == "profile"]
    report = (here / "quiet" / "report.md").read_text()
    assert f"- profile skipped: `{rel}` (working directory): measured while other processes used 0.93 cores" in report

    said = sb(*RUN, "--out", "allowed", "--allow-disturbed-profile")
    assert "skipped profile" not in said
    meta = yaml.safe_load((here / "allowed" / "run.yaml").read_text())
    assert meta["noise_guard"]["latency_floor"] == 0.5 and meta["data_files"]["skipped"] == []
    used = [u for u in meta["data_files"]["used"] if u["kind"] == "profile"]
    assert used and used[0]["path"] == rel and used[0]["source"] == "working directory"
    assert "disturbed" in used[0]["flags"] and "noise guard, predictions, roofline" in used[0]["used_for"]
    report = (here / "allowed" / "report.md").read_text()
    assert f"- profile used: `{rel}` (working directory; disturbed), for noise guard" in report
    assert "used because of --allow-disturbed-profile" in report


def test_a_disturbed_copy_gives_way_to_the_next_source(here, monkeypatch):
    cache = here / "cache"
    quiet = write_profile(cache)
    disturb(write_profile(here))
    found = lookup.find_profile(HW, "tiny", "float32")
    assert found.path == quiet and found.source == "user cache" and found.flags == ()
    monkeypatch.setenv(lookup.ALLOW_ENV, "1")  # a machine that is always busy allows them for every command
    found = lookup.find_profile(HW, "tiny", "float32", use_for="test")
    assert found.source == "working directory"
    assert lookup.record()["used"][0]["note"].endswith(f"used because of {lookup.ALLOW_ENV} being set")
    monkeypatch.delenv(lookup.ALLOW_ENV)
    lookup.allow_disturbed(True)
    assert lookup.find_profile(HW, "tiny", "float32").source == "working directory"


def test_a_tree_built_from_a_disturbed_profile_is_flagged_and_skipped_by_tree_auto(here):
    from specbench.core.tree_file import find_auto_tree

    disturb(write_profile(here))
    write_acceptance(here, "medusa")
    said = sb("build-tree", "--model", "random:tiny", "--method", "medusa", "--dtype", "float32", code=2)
    assert "was measured on a disturbed machine" in said and "--allow-disturbed-profile" in said
    said = sb("build-tree", "--model", "random:tiny", "--method", "medusa", "--dtype", "float32",
              "--allow-disturbed-profile")
    tree = here / "trees" / "tiny" / f"medusa-{HW}-float32.yaml"
    assert f"Wrote trees/tiny/medusa-{HW}-float32.yaml (working directory)" in said
    assert yaml.safe_load(tree.read_text())["latency_profile"]["disturbed"] is True
    lookup.start()
    assert find_auto_tree("tiny", "medusa", HW, "float32") is None  # skipped, not taken
    assert "built from a profile measured on a disturbed machine" in lookup.record()["skipped"][0]["why"]
    lookup.start(allow_disturbed=True)
    hit = find_auto_tree("tiny", "medusa", HW, "float32")
    assert hit is not None and hit[1] == str(here / tree.relative_to(here))
    assert lookup.record()["used"][0]["flags"] == ["disturbed"]


def test_list_profiles_and_trees_say_what_a_run_here_takes_and_skips(here):
    from specbench.core import listing

    disturb(write_profile(here))
    write_profile(here / "cache", dtype="bfloat16")
    rows = {(r.source, r.what): r for r in listing.profiles(HW, "tiny")}
    assert rows["working directory", "float32, eager runs"].status.startswith(
        "skipped: measured while other processes used 0.93 cores")
    assert rows["working directory", "float32, eager runs"].flags == "disturbed"
    assert rows["user cache", "bfloat16, eager runs"].status.startswith("used by --dtype auto")
    said = sb("list", "profiles", "--model", "random:tiny")
    assert "working directory" in said and "skipped:" in said and "user cache" in said

    tree = here / "trees" / "tiny" / f"medusa-{HW}-float32.yaml"
    tree.parent.mkdir(parents=True)
    tree.write_text(yaml.safe_dump({"method": "medusa", "hardware": HW, "dtype": "float32",
                                    "latency_profile": {"disturbed": True}, "states": {0: [[[0], 0]]}}))
    mine = [r for r in listing.trees(HW, "tiny", ("float32",)) if r.source == "working directory"]
    assert mine[0].status.startswith("skipped: built from a profile measured on a disturbed machine")
    mine = [r for r in listing.trees(HW, "tiny", ("float32",), allow_disturbed=True)
            if r.source == "working directory"]
    assert mine[0].status == "used by --tree auto: medusa float32"
    said = sb("list", "trees", "--model", "random:tiny", "--dtype", "float32")
    assert "skipped:" in said and "working directory" in said


def test_nothing_is_filed_into_a_source_checkout_unasked(here, monkeypatch):
    checkout = here / "clone"
    (checkout / ".git").mkdir(parents=True)
    (checkout / "specbench").mkdir()
    (checkout / "specbench" / "__init__.py").write_text("")
    assert store.write_root() == (store.Path("."), store.WORKING_DIRECTORY)
    monkeypatch.chdir(checkout)
    assert store.write_root() == (here / "cache", store.USER_CACHE)
    said = sb("profile", "--model", "random:tiny", "--dtype", "float32", "--widths", "1,2", "--kv-length", 8,
              "--repeats", 1)
    filed = here / "cache" / "profiles" / HW / "tiny-float32.yaml"
    assert filed.is_file() and not (checkout / "profiles").exists()
    assert "(user cache (the working directory is a source checkout of specbench" in said
    lookup.allow_disturbed(True)  # this busy test machine may have flagged it
    assert lookup.find_profile(HW, "tiny", "float32").path == filed  # and runs here read it from there
    sb("profile", "--model", "random:tiny", "--dtype", "float32", "--widths", "1,2", "--kv-length", 8,
       "--repeats", 1, "--out", "profiles/mine.yaml")
    assert (checkout / "profiles" / "mine.yaml").is_file()  # asked for: written


def test_inside_the_checkout_specbench_runs_from_what_was_measured_here_wins_over_the_shipped_file(here,
                                                                                                   monkeypatch):
    """A command run inside the checkout files its profile in the user cache (above); the next command there must
    read that one, not the shipped file it was measured to replace (found in stop 71: a fresh profile of this
    machine lost to a shipped profile of another chip with the same hardware key)."""
    checkout = here / "checkout"
    monkeypatch.setattr(store, "checkout", lambda: checkout)
    shipped = write_profile(checkout)
    cached = write_profile(here / "cache")
    monkeypatch.chdir(checkout)
    assert [name for name, _ in store.sources()] == [store.USER_CACHE, store.SHIPPED]
    lookup.allow_disturbed(True)
    assert lookup.find_profile(HW, "tiny", "float32").path == cached != shipped
    monkeypatch.chdir(here)  # elsewhere: the working directory first, as before
    assert [name for name, _ in store.sources()] == [store.WORKING_DIRECTORY, store.USER_CACHE, store.SHIPPED]


def test_a_compiled_run_reads_the_compiled_profile_never_the_other_way(here):
    eager = write_profile(here)
    found = lookup.find_profile(HW, "tiny", "float32", compiled=True)
    assert found.path == eager and lookup.EAGER_FOR_COMPILED in found.flags  # stands in, flagged
    compiled = here / "profiles" / HW / "tiny-float32@compiled.yaml"
    data = yaml.safe_load(eager.read_text())
    compiled.write_text(yaml.safe_dump({**data, "placement": "compiled", "compile": {"seconds": 1.0}}))
    found = lookup.find_profile(HW, "tiny", "float32", compiled=True)
    assert found.path == compiled and "compiled" in found.flags
    assert lookup.find_profile(HW, "tiny", "float32").path == eager
    compiled.write_text(eager.read_text())  # an eager curve under the compiled name is not a compiled one
    found = lookup.find_profile(HW, "tiny", "float32", compiled=True)
    assert found.path == eager and lookup.EAGER_FOR_COMPILED in found.flags
    assert "an eager profile filed under the compiled name" in lookup.record()["skipped"][0]["why"]
    # a compiled curve filed under the plain name in a folder of its own (benchmarks/compile_methods.sh): a compiled
    # run takes it as compiled; an eager lookup says what it is wherever it is used
    compiled.unlink()
    eager.write_text(yaml.safe_dump({**data, "placement": "compiled", "compile": {"seconds": 1.0}}))
    assert lookup.find_profile(HW, "tiny", "float32", compiled=True).flags == ("compiled",)
    assert lookup.find_profile(HW, "tiny", "float32").flags == ("compiled",)


def test_a_recommendation_followed_is_named_with_its_flags(here):
    rec = here / "recommendations" / "tiny" / f"{HW}.yaml"
    rec.parent.mkdir(parents=True)
    rec.write_text(yaml.safe_dump({"method": "ar", "dtype": "float32", "hardware": HW, "predicted": 1.0,
                                   "measured": None}))
    said = sb("run", "--model", "random:tiny", "--method", "auto", "--dataset", "p.jsonl", "--max-new-tokens", 6,
              "--warmup", 0, "--limit", 1, "--out", "r")
    assert f"recommendations/tiny/{HW}.yaml (working directory; unconfirmed)" in said
    meta = yaml.safe_load((here / "r" / "run.yaml").read_text())
    used = [u for u in meta["data_files"]["used"] if u["kind"] == "recommendation"]
    assert used[0]["flags"] == ["unconfirmed"] and used[0]["used_for"] == ["--method auto"]


def test_a_compiled_runs_noise_guard_and_predictions_read_the_compiled_curve(here, tiny):
    from specbench.planning.batch_choice import local_profile

    eager = write_profile(here)
    data = yaml.safe_load(eager.read_text())
    data["curves"][0]["median_ms"] = [m / 2 for m in data["curves"][0]["median_ms"]]
    (eager.parent / "tiny-float32@compiled.yaml").write_text(
        yaml.safe_dump({**data, "placement": "compiled", "compile": {"seconds": 1.0}}))
    assert local_profile(tiny).latency_ms(1) == 10.0
    assert local_profile(tiny, compiled=True, use_for="noise guard").latency_ms(1) == 5.0
    used = lookup.record()["used"]
    assert used[0]["path"] == f"profiles/{HW}/tiny-float32@compiled.yaml" and "compiled" in used[0]["flags"]

"""Sharded runs: `run --shard I/N` + `merge`, and `run --shards N` on a local Ray (2 workers x 1 CPU), against the
same run unsharded on random:tiny: the merged records (timing columns aside) and tokens are the unsharded run's."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from specbench.cli import app

cli = CliRunner()
TINY = ["--model", "random:tiny", "--max-new-tokens", "16", "--warmup", "0", "--limit", "4"]
# what a run decodes and checks, as opposed to how long it took and where (timing columns, threads, git)
SAME = ["method", "dataset", "prompt_id", "category", "turn", "prompt_tokens", "new_tokens", "target_forwards", "tau",
        "drafted", "draft_forwards", "accepted_drafts", "acceptance_rate", "lossless", "stopped",
        "accepted_per_position", "temperature", "model", "dtype", "order", "batch_size", "batching", "target_tokens"]


def invoke(*args):
    return cli.invoke(app, [str(a) for a in args])


def ok(*args):
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result


def refused(*args, text: str):
    result = invoke(*args)
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and text in said and "Traceback" not in said, result.output
    return said


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Five prompts (one of two turns); the run unsharded, and as shards 0/2 and 1/2."""
    root = tmp_path_factory.mktemp("shards")
    prompts = root / "mine.jsonl"
    rows = [{"prompt": "def add(a, b): return a + b\n" * 3}, {"instruction": "count 1 2 3 4 5 6 1 2 3"},
            {"question": "what is 12 + 30?"}, {"turns": ["hello there", "and again hello there"]},
            {"prompt": "abc abc abc abd"}]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = ["run", *TINY, "--limit", 5, "--dataset", prompts]
    ok(*args, "--out", root / "whole")
    for i in range(2):
        ok(*args, "--shard", f"{i}/2", "--out", root / f"s{i}")
    return {"root": root, "args": args, "whole": root / "whole", "s0": root / "s0", "s1": root / "s1"}


def records(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "records.csv", dtype=str, keep_default_na=False)[SAME]


def tokens(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "tokens.jsonl").read_text().splitlines()]


def assert_same_run(merged: Path, whole: Path) -> None:
    pd.testing.assert_frame_equal(records(merged), records(whole))
    assert tokens(merged) == tokens(whole)


def edited(src: Path, dst: Path, change) -> Path:
    """A copy of shard folder `src` whose run.yaml went through `change`."""
    shutil.copytree(src, dst)
    meta = yaml.safe_load((dst / "run.yaml").read_text())
    change(meta)
    (dst / "run.yaml").write_text(yaml.safe_dump(meta))
    return dst


def test_shards_split_round_robin_and_merge_to_the_unsharded_run(runs, tmp_path):
    assert set(records(runs["s0"]).prompt_id) == {"0", "2", "4"}
    assert set(records(runs["s1"]).prompt_id) == {"1", "3"}
    assert yaml.safe_load((runs["s1"] / "run.yaml").read_text())["settings"]["shard"] == "1/2"
    out = tmp_path / "merged"
    ok("merge", runs["s1"], runs["s0"], "--out", out)
    assert_same_run(out, runs["whole"])
    report = (out / "report.md").read_text()
    assert "## Shards" in report and "| 0/2 |" in report and "| 1/2 |" in report and "ar_tokens_per_s" in report
    assert len(pd.read_csv(out / "summary.csv")) == 2
    refused("merge", runs["s0"], runs["s1"], "--out", out, text="already holds a run")


def test_bad_shard_options_are_refused_before_any_model_loads(runs, tmp_path):
    for bad in ("3/2", "x/y", "-1/2", "2/2", "1/0"):
        refused(*runs["args"], "--shard", bad, "--out", tmp_path / "bad", text="--shard")
    refused(*runs["args"], "--shard", "5/8", "--out", tmp_path / "bad", text="only 5 prompt(s)")
    refused(*runs["args"], "--shard", "0/2", "--batch-size", "2", "--out", tmp_path / "bad",
            text="one prompt at a time")
    refused(*runs["args"], "--shard", "0/2", "--shards", "2", "--out", tmp_path / "bad", text="give one")
    refused(*runs["args"], "--gpus-per-shard", "1", "--out", tmp_path / "bad", text="go with --shards")
    assert not (tmp_path / "bad").exists()


def test_merge_refuses_overlaps_other_splits_and_non_shards(runs, tmp_path):
    twin = edited(runs["s0"], tmp_path / "twin", lambda m: None)
    refused("merge", runs["s0"], twin, runs["s1"], "--out", tmp_path / "m", text="shard 0/2 twice")

    def claim_index_1(meta):  # shard 0's prompts under shard 1's name: they overlap with the real shard 0
        meta["shard"]["index"] = 1
        meta["settings"]["shard"] = "1/2"
    refused("merge", runs["s0"], edited(runs["s0"], tmp_path / "claim", claim_index_1), "--out", tmp_path / "m",
            text="is in two shards")

    def of_three(meta):
        meta["shard"]["count"] = 3
    refused("merge", runs["s0"], edited(runs["s1"], tmp_path / "three", of_three), "--out", tmp_path / "m",
            text="different splits")
    refused("merge", runs["s0"], runs["whole"], "--out", tmp_path / "m", text="is not a shard")
    refused("merge", runs["s0"], tmp_path / "nowhere", "--out", tmp_path / "m", text="is not a folder")
    assert not (tmp_path / "m").exists()


def test_merge_refuses_shards_of_another_configuration_naming_the_setting(runs, tmp_path):
    def longer(meta):
        meta["settings"]["max_new_tokens"] = 32
    said = refused("merge", runs["s0"], edited(runs["s1"], tmp_path / "long", longer), "--out", tmp_path / "m",
                   text="another run")
    assert "max_new_tokens: 16 -> 32" in said


def test_merge_refuses_missing_shards_unless_partial(runs, tmp_path):
    refused("merge", runs["s0"], "--out", tmp_path / "m", text="missing shard(s) 1/2")
    ok("merge", runs["s0"], "--out", tmp_path / "m", "--allow-partial")
    assert "PARTIAL" in (tmp_path / "m" / "report.md").read_text()
    assert set(records(tmp_path / "m").prompt_id) == {"0", "2", "4"}


def test_mixed_hardware_is_refused_or_reported_per_key_never_pooled(runs, tmp_path):
    def elsewhere(meta):
        meta["environment"]["hardware"] = "gpu-other"
    other = edited(runs["s1"], tmp_path / "other", elsewhere)
    said = refused("merge", runs["s0"], other, "--out", tmp_path / "m", text="2 hardware keys")
    assert "--per-hardware" in said and "gpu-other: shard(s) 1/2" in said
    out = tmp_path / "per"
    ok("merge", runs["s0"], other, "--out", out, "--per-hardware")
    keys = yaml.safe_load((out / "merge.yaml").read_text())["hardware_keys"]
    assert len(keys) == 2 and "gpu-other" in keys
    for key in keys:
        assert (out / key / "report.md").exists() and (out / key / "records.csv").exists()
    assert set(records(out / "gpu-other").prompt_id) == {"1", "3"}
    assert "never pooled" in (out / "report.md").read_text()
    assert set(pd.read_csv(out / "summary.csv").hardware) == set(keys)
    assert not (out / "records.csv").exists()  # nothing at the top that `report` could pool


def test_merge_refuses_shards_that_decoded_a_method_with_different_trees(runs, tmp_path):
    """The same settings can resolve different trees on two machines (`--tree auto`): merge names the shards and
    their trees; one tree filed at two paths is one tree (compared by content); another hardware key may differ."""
    def ppd(digest, size, source):
        def change(meta):
            meta["resolved_trees"] = {"ppd": {1: {"digest": digest, "size": size, "source": source}}}
        return change
    here = edited(runs["s0"], tmp_path / "here", ppd("aaaaaaaaaaaa", 16, "/home/a/trees/tiny/ppd-cpu.yaml"))
    built = edited(runs["s1"], tmp_path / "built", ppd("bbbbbbbbbbbb", 12, "built, size 12 (no ppd tree)"))
    said = refused("merge", here, built, "--out", tmp_path / "m", text="different trees")
    assert "ppd" in said and "shard 0/2: size 16 [aaaaaaaaaaaa]" in said and "shard 1/2: size 12 [bbbbbbbbbbbb]" in said
    assert not (tmp_path / "m").exists()
    moved = edited(runs["s1"], tmp_path / "moved", ppd("aaaaaaaaaaaa", 16, "/home/b/trees/tiny/ppd-cpu.yaml"))
    ok("merge", here, moved, "--out", tmp_path / "same")

    def elsewhere(meta):
        ppd("bbbbbbbbbbbb", 12, "built")(meta)
        meta["environment"]["hardware"] = "gpu-other"
    ok("merge", here, edited(runs["s1"], tmp_path / "other", elsewhere), "--out", tmp_path / "per", "--per-hardware")

    def older(size):  # shards from before resolved_trees: run.yaml's `trees` (batch 1), compared by size
        return lambda meta: meta.update(trees={"ppd": {"tree": "trees/x.yaml", "size": size}}, resolved_trees=None)
    said = refused("merge", edited(runs["s0"], tmp_path / "o0", older(16)), edited(runs["s1"], tmp_path / "o1",
                   older(8)), "--out", tmp_path / "m", text="different trees")
    assert "size 16 from trees/x.yaml" in said and "size 8 from trees/x.yaml" in said


def test_runs_record_the_trees_they_resolved_by_content(tmp_path):
    from specbench.core.tree_file import TreeFile
    from specbench.run.shard import resolved_trees, tree_digest

    a = TreeFile({0: [((0,), 0), ((0, 0), 0), ((1,), 0)]}, 0, model="x", built_by="one way")
    same = TreeFile({0: [((0,), 0), ((0, 0), 0), ((1,), 0)]}, 0, model="y", built_by="another way")
    other = TreeFile({0: [((0,), 0), ((1,), 0)]}, 0)
    assert tree_digest(a) == tree_digest(same) != tree_digest(other)

    class Tree:  # a tree method as resolved_trees reads it: batch size -> its tree and source
        plans = {1: type("B", (), {"tree_file": a, "source": "trees/a.yaml"})(),
                 4: type("B", (), {"tree_file": other, "source": "built"})()}
    got = resolved_trees({"ar": object(), "ppd": Tree()})
    assert got == {"ppd": {1: {"digest": tree_digest(a), "size": 3, "source": "trees/a.yaml"},
                           4: {"digest": tree_digest(other), "size": 2, "source": "built"}}}


def sibling_rows(sibling_cpu: float, placement: str = "single:cpu") -> pd.DataFrame:
    """ar and pld on 4 quiet prompts of one shard, whose sibling shards used `sibling_cpu` cores meanwhile."""
    rows = []
    for i in range(4):
        for method, wall, forwards, drafted in (("ar", 10.0, 100, 0), ("pld", 8.0, 67, 50)):
            rows.append({"method": method, "dataset": "d", "prompt_id": str(i), "turn": 0, "new_tokens": 100,
                         "wall_s": wall, "tokens_per_s": 100 / wall, "target_forwards": forwards, "drafted": drafted,
                         "accepted_drafts": drafted // 2, "lossless": "match" if drafted else "", "peak_mem_mb": 1.0,
                         "foreign_cpu": 0.0, "steal": 0.0, "sibling_cpu": sibling_cpu, "placement": placement})
    return pd.DataFrame(rows)


def test_the_timing_verdict_says_when_sibling_shards_shared_the_machine():
    """Sibling shards are planned, not foreign load (not disturbed), but they share the memory bandwidth: the
    verdict says so when they worked, and stays a plain "ok" when they idled or were the run's own --tp ranks."""
    from specbench.report.summary import summarize

    shared = summarize(sibling_rows(0.97)).set_index("method").timing
    for method in ("ar", "pld"):
        assert shared[method].startswith("ok; beside sibling shards using up to 0.97 cores")
        assert "memory bandwidth" in shared[method] and ":" not in shared[method]  # tables cut a verdict at ':'
    assert (summarize(sibling_rows(0.05)).timing == "ok").all()
    assert (summarize(sibling_rows(0.97, placement="tp2")).timing == "ok").all()
    busy = sibling_rows(0.97).assign(foreign_cpu=1.2)
    said = summarize(busy).set_index("method").timing["pld"]
    assert said.startswith("disturbed: ") and said.endswith("these are a shared machine's times)")


def test_shards_without_ray_installed_says_how_to_install(runs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    refused(*runs["args"], "--shards", "2", "--out", tmp_path / "r", text="pip install 'specbench[ray]'")


# --- on a local Ray: 2 workers x 1 CPU (one session for these tests; ray.init takes several seconds) ---

@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    from specbench.run.ray_shards import _package_path

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING",
                 runtime_env={"env_vars": {"PYTHONPATH": _package_path()}})
    yield ray
    if started:
        ray.shutdown()


def test_ray_shards_merge_to_the_unsharded_run_and_resume_finishes_a_shard(runs, ray_session, tmp_path):
    out = tmp_path / "ray"
    ok(*runs["args"], "--shards", 2, "--out", out)
    assert sorted(p.name for p in (out / "shards").iterdir() if p.is_dir()) == ["000-of-002", "001-of-002"]
    assert_same_run(out, runs["whole"])
    # every process of the run filed its pid, so that each shard's guard counts the others as siblings
    assert sorted(p.name for p in (out / "shards").glob("*.pid")) == ["000-of-002.pid", "001-of-002.pid",
                                                                       "driver.pid"]
    assert "sibling_cpu" in pd.read_csv(out / "records.csv").columns
    assert "## Shards" in (out / "report.md").read_text()
    refused(*runs["args"], "--shards", 2, "--out", out, text="--resume")
    refused(*runs["args"], "--shards", 3, "--out", out, "--resume", text="other shards")

    # shard 1 cut short (its first prompt kept): --resume runs only what is missing and the merge still matches
    shard = out / "shards" / "001-of-002"
    kept = pd.read_csv(shard / "records.csv", dtype=str, keep_default_na=False)
    kept[kept.prompt_id == "1"].to_csv(shard / "records.csv", index=False)
    meta = yaml.safe_load((shard / "run.yaml").read_text())
    (shard / "run.yaml").write_text(yaml.safe_dump({**meta, "complete": False}))
    ok(*runs["args"], "--shards", 2, "--out", out, "--resume")
    assert_same_run(out, runs["whole"])


def test_ray_retries_a_killed_worker_which_continues_its_records(runs, ray_session, tmp_path, monkeypatch):
    from specbench.run.ray_shards import KILL_ENV

    monkeypatch.setenv(KILL_ENV, "0:2")  # shard 0's worker dies once it has written 2 records, first attempt only
    out = tmp_path / "ray"
    ok(*runs["args"], "--shards", 2, "--out", out)
    assert (out / "shards" / ".000-of-002.killed").exists()  # it did die
    assert "Resuming" in (out / "shards" / "000-of-002.log").read_text()  # and its retry continued its records
    assert_same_run(out, runs["whole"])
    shard = pd.read_csv(out / "shards" / "000-of-002" / "records.csv", dtype=str)
    assert not shard.duplicated(["method", "dataset", "prompt_id", "turn"]).any()


def test_ray_ctrl_c_keeps_finished_records_and_resume_finishes(runs, ray_session, tmp_path, monkeypatch):
    out = tmp_path / "ray"
    real_wait = ray_session.wait

    def interrupt_once_records_exist(refs, **kwargs):  # Ctrl-C in the driver once a shard holds 2 records
        written = [p for p in (out / "shards").glob("*/records.csv") if len(p.read_text().splitlines()) > 2]
        if written:
            raise KeyboardInterrupt
        return real_wait(refs, **kwargs)

    monkeypatch.setattr(ray_session, "wait", interrupt_once_records_exist)
    result = invoke(*runs["args"], "--shards", 2, "--out", out)
    said = " ".join(result.output.split())
    assert result.exit_code == 130 and "records kept" in said and "--resume" in said, result.output
    assert "PARTIAL" in (out / "report.md").read_text()
    monkeypatch.setattr(ray_session, "wait", real_wait)
    ok(*runs["args"], "--shards", 2, "--out", out, "--resume")
    assert_same_run(out, runs["whole"])
    assert "PARTIAL" not in (out / "report.md").read_text()


def test_ray_resume_of_a_folder_that_is_not_a_run_is_refused(tmp_path):
    from specbench.errors import SpecbenchError
    from specbench.run.ray_shards import prepare

    with pytest.raises(SpecbenchError, match="is not a run folder"):
        prepare(tmp_path / "absent", True, 2)
    assert not (tmp_path / "absent").exists()

"""`specbench recommend` (issue 29, item 4): every tree method's speedup predicted from the profile and acceptance
files (no decoding), the best confirmed beside ar in a short run, the pick written and filed; `run --method auto`
runs it, and without a recommendation says to run `specbench recommend`."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.errors import SpecbenchError

from .conftest import feature_artifact, heads_artifact
from .test_auto_tree import HW, write_acceptance, write_profile


def sb(*args, code: int = 0) -> str:
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    return " ".join(res.output.split())


@pytest.fixture
def store(tmp_path, monkeypatch, tiny):
    """A working directory holding, for random:tiny on this hardware: a float32 profile, eagle and medusa artefacts
    and acceptance files; no trees, no ppd artefact; and four prompts."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    write_profile(tmp_path)
    feature_artifact(tiny, tmp_path / "artifacts" / "tiny" / "eagle")
    heads_artifact(tiny, tmp_path / "artifacts" / "tiny" / "medusa")
    for family in ("eagle", "medusa"):
        write_acceptance(tmp_path, family)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"count {i} {i} {i} and again {i}"}) + "\n"
                                                    for i in range(4)))
    return tmp_path


def test_prediction_only(store):
    said = sb("recommend", "--model", "random:tiny", "--confirm", 0, "--out", "rec")
    assert "not measured: --confirm 0" in said and "why not available" in said
    rec = yaml.safe_load((store / "rec" / "recommendation.yaml").read_text())
    why = {m["method"]: m.get("why_not", "") for m in rec["methods"]}
    assert "`specbench train ppd --model random:tiny`" in why["ppd"]  # why ppd is not available
    assert "estimate" not in why["parallelspec"]  # no artefact: training comes first
    assert rec["method"] in ("eagle", "medusa", "ar") and rec["measured"] is None and rec["run"] is None
    assert rec["hardware"] == HW and rec["dtype"] == "float32"
    predicted = {m["method"]: m.get("predicted") for m in rec["methods"]}
    assert predicted["eagle"] and predicted["medusa"] and predicted["ar"] == 1.0 and predicted["ppd"] is None
    assert rec["predicted"] == max(v for v in predicted.values() if v)
    assert (store / "trees" / "tiny" / f"eagle-{HW}-float32.yaml").is_file()  # built as --tree auto would
    trees = {m["method"]: m.get("tree") for m in rec["methods"]}
    assert trees["eagle"] == f"trees/tiny/eagle-{HW}-float32.yaml"  # relative: the file can be shipped
    assert yaml.safe_load((store / "recommendations" / "tiny" / f"{HW}.yaml").read_text()) == rec
    assert not (store / "rec" / "run").exists()
    assert rec["confirmed"] is False and {"pld", "suffix", "lookahead", "sd", "pearl"} <= set(rec["not_considered"])
    assert "not confirmed" in said and "pld, suffix, lookahead, sd, pearl were not considered" in said


def test_an_unconfirmed_recommendation_says_so_when_run_auto_follows_it(store):
    sb("recommend", "--model", "random:tiny", "--confirm", 0, "--out", "rec")
    said = sb("run", "--method", "auto", "--model", "random:tiny", "--dataset", "prompts.jsonl", "--limit", 1,
              "--max-new-tokens", 8, "--warmup", 0, "--out", "auto")
    assert "NOT CONFIRMED: a prediction never measured here" in said
    assert "pld, suffix, lookahead, sd, pearl were not considered" in said


def test_sd_and_pearl_are_measured_where_the_model_has_a_drafter(store):
    from specbench.run import recommend

    assert recommend.measured_only("random:tiny") == ["pld", "suffix", "lookahead"]  # no drafter: the draft-free ones
    from specbench.methods.sd.drafter import META_FILE, WEIGHTS_FILE

    folder = store / "artifacts" / "tiny" / "drafter"
    folder.mkdir(parents=True)
    for name in (META_FILE, WEIGHTS_FILE):  # what `run --method sd` looks for (its contents are read on load)
        (folder / name).write_text("")
    assert recommend.measured_only("random:tiny") == ["pld", "suffix", "lookahead", "sd", "pearl"]


def test_a_tree_built_with_a_timed_drafter_is_predicted_with_that_time(store):
    """recommend builds a drafting method's missing tree as `run --tree auto` does, timing the drafter here and
    recording it in the tree (draft_forward_ms), and prices the tree with that time rather than the acceptance
    file's moved here: a dearer drafter lowers eagle's prediction."""
    def eagle_predicted() -> float:
        sb("recommend", "--model", "random:tiny", "--confirm", 0, "--out", "rec")
        rec = yaml.safe_load((store / "rec" / "recommendation.yaml").read_text())
        return next(m["predicted"] for m in rec["methods"] if m["method"] == "eagle")

    timed = eagle_predicted()
    for family in ("eagle", "medusa"):
        data = yaml.safe_load((store / "trees" / "tiny" / f"{family}-{HW}-float32.yaml").read_text())
        assert data["draft_forward_ms"] > 0 and f"timed on {HW} float32" in data["draft_cost"]
    tree = store / "trees" / "tiny" / f"eagle-{HW}-float32.yaml"
    data = yaml.safe_load(tree.read_text())
    tree.write_text(yaml.safe_dump({**data, "draft_forward_ms": 1000.0}, sort_keys=False))
    assert eagle_predicted() < timed / 2


def test_a_tree_without_its_drafting_time_is_priced_by_the_step_drafting_timed_here(store, monkeypatch):
    """A tree found without draft_forward_ms (shipped in trees/, or built from files alone) is priced by the step's
    drafting of that tree timed now on the loaded target (DraftPricing.ms_here), not by the acceptance file's bare
    drafter forward; the recommendation and the console say where each drafting price came from."""
    from specbench.methods.tree.pricing import DraftPricing

    sb("recommend", "--model", "random:tiny", "--confirm", 0, "--out", "rec")  # builds both trees
    for family in ("eagle", "medusa"):  # as shipped: no drafting time recorded
        tree = store / "trees" / "tiny" / f"{family}-{HW}-float32.yaml"
        data = yaml.safe_load(tree.read_text())
        data.pop("draft_forward_ms")
        tree.write_text(yaml.safe_dump(data, sort_keys=False))
        acc = store / "acceptance" / "tiny" / f"{family}.yaml"  # the bare forward: nearly free
        acc.write_text(yaml.safe_dump({**yaml.safe_load(acc.read_text()), "dtype": "float32",
                                       "draft_forward_ms": 0.001, "draft_forward_hardware": HW}))
    asked = []
    monkeypatch.setattr(DraftPricing, "ms_here", lambda self, tree=None: asked.append(tree) or 50.0)
    said = sb("recommend", "--model", "random:tiny", "--confirm", 0, "--out", "rec")
    rec = {m["method"]: m for m in yaml.safe_load((store / "rec" / "recommendation.yaml").read_text())["methods"]}
    assert len(asked) == 2 and all(t is not None for t in asked)  # each found tree, drafted as the step drafts it
    for method in ("eagle", "medusa"):
        assert "50.00 ms per drafting forward" in rec[method]["draft_price"]
        assert "timed now on the loaded target" in rec[method]["draft_price"]
        assert f"{method}'s drafting: 50.00 ms" in said
        # 50 ms of drafting beside a 10 ms verify forward (the profile's L(1)): the file's 0.001 ms would predict
        # a speedup over 1, the run's price predicts a slowdown
        assert rec[method]["predicted"] < 0.5


def test_drafting_is_priced_from_the_tree_then_a_timing_here_then_the_bare_forward_said_optimistic(tmp_path):
    from types import SimpleNamespace

    from specbench.planning.predict import drafting_price

    acc = tmp_path / "eagle.yaml"
    acc.write_text(yaml.safe_dump({"method": "eagle", "draft_forward_ms": 2.0}))
    recorded, bare = SimpleNamespace(extra={"draft_forward_ms": 7.0}), SimpleNamespace(extra={})
    cost, said = drafting_price("eagle", recorded, acc, None, timed_ms=5.0)
    assert cost(3) == 21.0 and "timed as the tree was built" in said  # eagle: once per depth
    cost, said = drafting_price("eagle", bare, acc, None, timed_ms=5.0)
    assert cost(3) == 15.0 and "timed now on the loaded target" in said
    cost, said = drafting_price("eagle", bare, acc, None)
    assert cost(3) == 6.0 and "bare drafter forward" in said and "optimistic" in said
    cost, said = drafting_price("medusa", bare, acc, None)
    assert cost(3) == 2.0  # medusa: its heads once a step
    assert drafting_price("ppd", bare, acc, None) == (None, "")  # the guesses ride in the target's forward


def test_an_unknown_model_is_refused_and_nothing_is_filed(store):
    said = sb("recommend", "--model", "./no-such-model", "--confirm", 0, "--out", "rec", code=2)
    assert "model path not found: ./no-such-model" in said
    assert not (store / "rec").exists() and not (store / "recommendations").exists()


def test_run_auto_without_a_recommendation_says_what_to_run(store):
    said = sb("run", "--method", "auto", "--model", "random:tiny", "--dataset", "prompts.jsonl", code=2)
    assert "`specbench recommend --model random:tiny`" in said
    assert not (store / "results").exists()


def test_a_confirmed_recommendation_is_what_run_auto_runs(store):
    said = sb("recommend", "--model", "random:tiny", "--confirm", 1, "--dataset", "prompts.jsonl", "--limit", 2,
              "--max-new-tokens", 8, "--out", "rec")
    rec = yaml.safe_load((store / "rec" / "recommendation.yaml").read_text())
    assert rec["run"] == "rec/run" and (store / "rec" / "run" / "records.csv").is_file()
    assert (store / "rec" / "run" / "summary.csv").is_file() and (store / "rec" / "run" / "report.md").is_file()
    measured = {m["method"]: m.get("measured") for m in rec["methods"]}
    # pld, suffix and lookahead: measured beside the best predicted
    assert measured["ar"] == 1.0 and measured["pld"] is not None and measured["suffix"] is not None
    assert measured["lookahead"] is not None
    assert sum(v is not None for v in measured.values()) == 5
    assert rec["measured"] == measured[rec["method"]] and f"Use {rec['method']}" in said
    assert rec["confirmed"] is True
    said = sb("run", "--method", "auto", "--model", "random:tiny", "--dataset", "prompts.jsonl", "--limit", 1,
              "--max-new-tokens", 8, "--warmup", 0, "--out", "again")
    assert f"--method auto: {rec['method']}" in said
    meta = yaml.safe_load((store / "again" / "run.yaml").read_text())
    assert meta["settings"]["methods"] == (["ar"] if rec["method"] == "ar" else ["ar", rec["method"]])
    filed = store / "recommendations" / "tiny" / f"{HW}.yaml"
    before = filed.read_text()
    said = sb("recommend", "--model", "random:tiny", "--confirm", 0, "--out", "rec0")
    assert filed.read_text() == before  # a prediction does not replace a measured recommendation
    assert f"kept recommendations/tiny/{HW}.yaml" in said and "--recommendation rec0/recommendation.yaml" in said
    assert (store / "rec0" / "recommendation.yaml").is_file()


def test_without_a_profile_each_method_says_what_makes_it_and_ar_is_the_pick(store):
    (store / "profiles" / HW / "tiny-float32.yaml").unlink()
    sb("recommend", "--model", "random:tiny", "--confirm", 0, "--out", "rec")
    rec = yaml.safe_load((store / "rec" / "recommendation.yaml").read_text())
    why = {m["method"]: m.get("why_not", "") for m in rec["methods"]}
    assert rec["method"] == "ar" and rec["predicted"] == 1.0
    for method in ("eagle", "medusa"):
        assert "`specbench profile --model random:tiny --dtype float32 --device cpu`" in why[method]
        assert "estimate" not in why[method]  # its acceptance file exists


def test_recorded_tree_paths_are_relative_and_found_from_the_checkout(tmp_path, monkeypatch):
    from specbench.core import store as data_store

    shipped = tmp_path / "checkout"
    (shipped / "trees" / "tiny").mkdir(parents=True)
    tree = shipped / "trees" / "tiny" / "eagle-x-float32.yaml"
    tree.write_text("method: eagle\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setattr(data_store, "checkout", lambda: shipped)
    monkeypatch.chdir(elsewhere)
    assert data_store.data_relative(tree) == "trees/tiny/eagle-x-float32.yaml"  # below the checkout
    assert data_store.data_relative(tmp_path / "t.yaml") == str(tmp_path / "t.yaml")  # below neither: as given
    assert data_store.resolve_data_path("trees/tiny/eagle-x-float32.yaml") == str(tree)
    assert data_store.resolve_data_path("trees/tiny/none.yaml") == "trees/tiny/none.yaml"  # missing: as recorded


def test_a_relative_tree_path_is_found_in_the_checkout_from_any_directory(tmp_path, monkeypatch):
    """--tree trees/<model>/x.yaml reads the checkout's file when the working directory has none (what a shipped
    recommendation records); a path in neither is refused with the path as typed."""
    from specbench.core import store as data_store
    from specbench.core.tree_file import TreeFile, TreeSpec, resolve_tree

    shipped = tmp_path / "checkout"
    TreeFile({1: [((0,), 1)]}, 1, model="m", hardware="hw", dtype="float32").write(
        shipped / "trees" / "m" / "hw-float32.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setattr(data_store, "checkout", lambda: shipped)
    monkeypatch.chdir(elsewhere)
    tree, source = resolve_tree(TreeSpec.parse("trees/m/hw-float32.yaml"), "hw", None)
    assert tree.hardware == "hw" and source == "trees/m/hw-float32.yaml"
    with pytest.raises(SpecbenchError, match="--tree trees/m/none.yaml: no such file"):
        resolve_tree(TreeSpec.parse("trees/m/none.yaml"), "hw", None)


# ------------------------------------------------------------------------------------ the measured pick (issue 41)
def confirming(speedups: dict[str, list[float]], lossless: dict[str, list[str]] | None = None):
    """A confirming run's records: ar at 10 s a turn, each method at 10 / its per-prompt speedup; lossless cells
    "match", "near-tie" or "unexplained" per prompt (default: all match)."""
    import pandas as pd

    rows = []
    for p in range(len(next(iter(speedups.values())))):
        rows.append({"method": "ar", "dataset": "d", "prompt_id": str(p), "turn": 0, "new_tokens": 100,
                     "wall_s": 10.0, "lossless": "", "mismatch_explained": ""})
        for method, s in speedups.items():
            verdict = (lossless or {}).get(method, ["match"] * len(s))[p]
            rows.append({"method": method, "dataset": "d", "prompt_id": str(p), "turn": 0, "new_tokens": 100,
                         "wall_s": 10.0 / s[p], "lossless": "match" if verdict == "match" else "mismatch@3",
                         "mismatch_explained": "" if verdict == "match" else verdict})
    return pd.DataFrame(rows)


def table():
    from specbench.run.recommend import Row

    return [Row("ar", predicted=1.0), Row("eagle", "trees/e.yaml", 60, 1.5), Row("medusa", "trees/m.yaml", 20, 1.4),
            Row("pld")]


def test_a_tie_within_the_noise_goes_to_the_simpler_method():
    """Five prompts: eagle's point (1.38x) is above medusa's (1.35x), but prompt by prompt they trade places: the
    difference is noise, and medusa (a tree of 20 against 60) is picked. pld is slower beyond the noise."""
    from specbench.run.recommend import choose_measured

    records = confirming({"eagle": [1.6, 1.1, 1.5, 1.2, 1.6], "medusa": [1.3, 1.4, 1.3, 1.4, 1.3],
                          "pld": [1.05, 1.0, 1.1, 1.02, 1.04]})
    rows = table()
    pick, why = choose_measured(rows, records, "float32")
    measured = {r.method: r for r in rows}
    assert measured["eagle"].measured > measured["medusa"].measured  # the point alone would pick eagle
    assert pick.method == "medusa" and "within the noise of the fastest measured, eagle" in why[0]
    assert measured["eagle"].measured_lo < measured["eagle"].measured < measured["eagle"].measured_hi


def test_a_method_within_the_noise_of_ar_loses_to_ar():
    from specbench.run.recommend import choose_measured

    records = confirming({"pld": [1.3, 0.8, 1.25, 0.85, 1.1]})  # 1.03x, either way per prompt
    pick, why = choose_measured([r for r in table() if r.method in ("ar", "pld")], records, "float32")
    assert pick.method == "ar" and why[0].startswith("ar: within the noise of the fastest measured, pld")
    clear = confirming({"pld": [1.3, 1.25, 1.35, 1.28, 1.3]})
    assert choose_measured([r for r in table() if r.method in ("ar", "pld")], clear, "float32")[0].method == "pld"


def test_in_bf16_a_pick_is_lossless_or_explained():
    from specbench.run.recommend import choose_measured

    fast = {"eagle": [1.6, 1.6, 1.7, 1.6, 1.6], "medusa": [1.3, 1.3, 1.3, 1.3, 1.3]}
    unexplained = confirming(fast, {"eagle": ["match", "unexplained", "match", "match", "match"]})
    pick, why = choose_measured(table()[:3], unexplained, "bfloat16")
    assert pick.method == "medusa" and any(n.startswith("eagle not picked") and "unexplained" in n for n in why)
    near_ties = confirming(fast, {"eagle": ["match", "near-tie", "match", "near-tie", "match"]})
    assert choose_measured(table()[:3], near_ties, "bfloat16")[0].method == "eagle"  # explained by the rounding
    assert choose_measured(table()[:3], near_ties, "float32")[0].method == "medusa"  # float32: exact or nothing


def test_an_artefact_yaml_of_an_unexpected_shape_falls_back_to_the_acceptance_rows(tmp_path):
    """planning/predict.py's `a or len(b) if isinstance(data, dict) else 0` reads as `(a or len(b)) if ... else 0`
    (the conditional binds loosest), so a YAML that is not a mapping already fell back; but a mapping whose
    transfer_layers is not a list (a count, a mapping) raised TypeError out of `recommend`."""
    import specbench.methods  # noqa: F401  (planning.acceptance imported first cycles through methods.ppd)
    from specbench.planning import predict

    acceptance = tmp_path / "acceptance.yaml"
    acceptance.write_text(yaml.safe_dump({"per_rank": [[0.5], [0.3], [0.2]]}))
    meta = tmp_path / "hidden_transfer.yaml"
    for text in ("- 1\n- 2\n", "just text\n", "", "transfer_layers: 2\n", "transfer_layers: {a: 1}\n",
                 "prompt_tokens: many\n"):
        meta.write_text(text)
        assert predict._guessed(meta, acceptance) == 3, text
    meta.write_text(yaml.safe_dump({"prompt_tokens": 2}))
    assert predict._guessed(meta, acceptance) == 2
    meta.write_text(yaml.safe_dump({"transfer_layers": [1, 2]}))
    assert predict._guessed(meta, acceptance) == 2

"""--synthetic-acceptance: stated acceptance profiles (rates, acceptance files, speculation_profile.json), the seeded
rule, a run that keeps drafts by it (report, run.yaml, the check that fails on a broken acceptance path), and the
acceptance section's token- and request-weighted numbers."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.acceptance_profile import parse_rates, read, speculation_profile, write_speculation_profile
from specbench.core.synthetic import SyntheticAcceptance
from specbench.core.verify import Sampling
from specbench.errors import SpecbenchError
from specbench.methods.base import Generation
from specbench.report import acceptance


# ------------------------------------------------------------------------------------------------ profiles

def test_rates_give_conditional_marginal_and_the_chain_expectation():
    p = parse_rates("0.8,0.6,0.4")
    assert p.conditional == [0.8, 0.6, 0.4]
    assert p.marginal == pytest.approx([0.8, 0.48, 0.192])
    mean, var = p.chain_expectation(3)
    assert mean == pytest.approx(0.8 + 0.48 + 0.192)
    # beyond the stated positions nothing is accepted: a longer chain expects no more
    assert p.chain_expectation(6)[0] == pytest.approx(mean)
    # E[n^2] = P(n>=1) + 3 P(n>=2) + 5 P(n>=3)
    assert var == pytest.approx(0.8 + 3 * 0.48 + 5 * 0.192 - mean ** 2)


def test_per_rank_rates_and_a_tree_expectation():
    p = parse_rates("0.6/0.2,0.5")
    assert p.rate(1, 0) == 0.6 and p.rate(1, 1) == 0.2 and p.rate(2, 0) == 0.5 and p.rate(2, 1) == 0.0
    mean, _ = p.tree_expectation([(0,), (1,), (0, 0), (1, 0)])
    assert mean == pytest.approx(0.6 + 0.2 + 0.6 * 0.5 + 0.2 * 0.5)


@pytest.mark.parametrize("bad, said", [("0.8,1.5", "outside (0, 1]"), ("0,0.5", "outside (0, 1]"),
                                       ("0.8,abc", "no such file"), ("0.7/0.5", "sum to"),
                                       ("0.8,x0.2", "no such file"), ("0.8,,0.4", "not a number")])
def test_bad_rates_are_refused_with_one_line(bad, said):
    with pytest.raises(SpecbenchError, match=said.replace("(", r"\(").replace(")", r"\)")) as err:
        read(bad)
    assert "\n" not in str(err.value)


def test_acceptance_files_estimate_published_and_chain(tmp_path):
    published = read("acceptance/published/vicuna-7b/eagle.yaml")
    assert published.conditional[:2] == [0.79, 0.74] and len(published.per_rank[0]) == 10
    chain = tmp_path / "pld.yaml"
    chain.write_text(yaml.safe_dump({"method": "pld", "conditional": [0.5, 0.4, 0.0]}))
    assert read(str(chain)).conditional == [0.5, 0.4]  # a position never accepted ends the profile
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump({"per_rank": "high"}))
    with pytest.raises(SpecbenchError, match="needs `per_rank`"):
        read(str(wrong))
    wrong.write_text(yaml.safe_dump({"per_rank": [[0.5, 1.7]]}))
    with pytest.raises(SpecbenchError, match="probability"):
        read(str(wrong))


def test_speculation_profile_round_trip_with_categories(tmp_path):
    payload = speculation_profile([0.8, 0.5], "pld", "random:tiny", mean_per_step=2.2,
                                  per_category={"coding": {"conditional": [0.9, 0.6]}})
    assert payload["marginal_accept_rates"] == [0.8, 0.4]
    assert payload["validation"]["mean_consistency"]["implied_mean_accept_length"] == pytest.approx(2.2)
    path = tmp_path / "speculation_profile.json"
    write_speculation_profile(payload, path)
    back = read(str(path))
    assert back.conditional == [0.8, 0.5] and back.categories["coding"].conditional == [0.9, 0.6]
    assert read(f"{path}#coding").conditional == [0.9, 0.6]
    with pytest.raises(SpecbenchError, match="no category 'math'"):
        read(f"{path}#math")
    # a profile that states only the marginals (vLLM's convention)
    path.write_text(json.dumps({"marginal_accept_rates": [0.8, 0.4, 0.1]}))
    assert read(str(path)).conditional == pytest.approx([0.8, 0.5, 0.25])
    path.write_text(json.dumps({"conditional_accept_rates": "0.8"}))
    with pytest.raises(SpecbenchError, match="not a speculation profile"):
        read(str(path))


# ------------------------------------------------------------------------------------------------ the rule

def test_chain_draws_follow_the_stated_rates_and_the_next_token_is_the_targets():
    rule = SyntheticAcceptance(parse_rates("0.8,0.6,0.4"), seed=3)
    logits = torch.zeros(4, 10)
    logits[:, 7] = 1.0  # the target's argmax at every position
    gen = Generation()
    counts = [0] * 4
    for _ in range(4000):
        n, tok = rule.chain(torch.tensor([1, 2, 3]), logits, Sampling(), None, None, gen=gen)
        counts[n] += 1
        assert tok == 7
    assert counts[0] / 4000 == pytest.approx(0.2, abs=0.03)
    assert counts[3] / 4000 == pytest.approx(0.192, abs=0.03)
    assert gen.synthetic_mean == pytest.approx(4000 * 1.472)
    observed = sum(n * c for n, c in enumerate(counts))
    assert abs(observed - gen.synthetic_mean) < 5 * gen.synthetic_var ** 0.5
    # the same generator seed: the same draws (repeats and batch sizes see the same acceptance)
    draws = []
    for _ in range(2):
        g = torch.Generator().manual_seed(11)
        draws.append([rule.chain(torch.tensor([1, 2, 3]), logits, Sampling(), None, g)[0] for _ in range(50)])
    assert draws[0] == draws[1]


def test_tree_rule_descends_into_the_child_of_the_drawn_rank():
    # root 0; depth 1: node 1 (rank 0), node 2 (rank 1); depth 2: node 3 under node 2 (rank 0)
    paths, parents = [(0,), (1,), (1, 0)], [-1, 0, 0, 2]
    rule = SyntheticAcceptance(parse_rates("0.000001/0.999999,1"), seed=0)
    logits = torch.zeros(4, 10)
    logits[3, 5] = 1.0
    path, tok = rule.tree(torch.tensor([9, 1, 2, 3]), parents, paths, logits, Sampling(), None)
    assert path == [0, 2, 3] and tok == 5
    rule = SyntheticAcceptance(parse_rates("0.000001/0.999999,0.000001"), seed=0)
    assert rule.tree(torch.tensor([9, 1, 2, 3]), parents, paths, logits, Sampling(), None)[0] == [0, 2]


# ------------------------------------------------------------------------------------------------ a run

def _run(tmp_path, prompts_file, rates, *methods):
    out = tmp_path / "run"
    args = ["run", "--model", "random:tiny", "--max-new-tokens", "40", "--warmup", "0", "--dataset",
            str(prompts_file), "--limit", "3", "--out", str(out), "--synthetic-acceptance", rates]
    for m in methods:
        args += ["-m", m]
    return out, CliRunner().invoke(app, args)


def test_a_synthetic_run_reports_the_stated_acceptance(tmp_path, prompts_file, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    out, result = _run(tmp_path, prompts_file, "0.8,0.6,0.4", "medusa", "ppd", "pld")
    assert result.exit_code == 0, result.output
    report = (out / "report.md").read_text().splitlines()
    assert "**Synthetic acceptance**" in "\n".join(report[:6])  # in its first lines
    assert "Lossless check: not applicable" in "\n".join(report)
    meta = yaml.safe_load((out / "run.yaml").read_text())
    block = meta["synthetic_acceptance"]
    assert block["conditional"] == [0.8, 0.6, 0.4] and meta["settings"]["synthetic_acceptance"] == "0.8,0.6,0.4"
    assert set(block["checks"]) == {"medusa", "ppd", "pld"} and all(c["agrees"] for c in block["checks"].values())
    records = pd.read_csv(out / "records.csv")
    assert records.lossless.isna().all()  # no lossless verdict: the output is not the model's
    tau = records.groupby("method").new_tokens.sum() / records.groupby("method").target_forwards.sum()
    assert tau["medusa"] >= 1.5 and tau["ppd"] >= 1.5
    # random artefacts of the right shape (4 Medusa heads) and the tree searched over the stated rates
    assert meta["trees"]["medusa"]["acceptance"] == "--synthetic-acceptance: stated rates 0.8,0.6,0.4"


def test_a_broken_acceptance_path_fails_the_run(tmp_path, prompts_file, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    # a rule that keeps every draft while still stating 0.5 per position: the measured count disagrees
    monkeypatch.setattr(SyntheticAcceptance, "_true_rank", lambda self, depth, generator: 0)
    out, result = _run(tmp_path, prompts_file, "0.5,0.5,0.5", "pld", "ppd")
    assert result.exit_code != 0
    assert "synthetic acceptance check FAILED" in result.output and "Traceback" not in result.output
    checks = yaml.safe_load((out / "run.yaml").read_text())["synthetic_acceptance"]["checks"]
    assert not checks["ppd"]["agrees"]


def test_bad_rates_stop_the_run_before_loading(tmp_path, prompts_file):
    out, result = _run(tmp_path, prompts_file, "0.8,1.2")
    assert result.exit_code != 0 and "outside (0, 1]" in result.output and "Traceback" not in result.output
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ the report

def test_token_and_request_weighted_tau_differ_only_by_averaging():
    records = pd.DataFrame({
        "method": ["pld", "pld", "ar"], "new_tokens": [90, 10, 50], "target_forwards": [30, 10, 50],
        "tau": [3.0, 1.0, 1.0], "accepted_drafts": [60, 0, 0], "drafted": [80, 4, 0],
        "accepted_per_position": ["29/29 20/29 11/22", "0/4", ""]})
    t = acceptance.table(records).set_index("method")
    assert t.loc["pld", "tau (token-weighted)"] == 2.5  # 100 tokens / 40 forwards
    assert t.loc["pld", "tau per request"] == 2.0  # (3 + 1) / 2
    conditional, marginal = acceptance.per_position(records[records.method == "pld"])
    # position 2 was reached by at most the 29 steps that kept position 1; position 3 by at most the 20 that kept 2
    assert conditional == pytest.approx([29 / 33, 20 / 29, 11 / 20])
    assert marginal == pytest.approx([29 / 33, 29 / 33 * 20 / 29, 29 / 33 * 20 / 29 * 11 / 20])
    assert acceptance.never_drafted(records) == []
    assert acceptance.never_drafted(records.assign(drafted=[0, 0, 0])) == ["pld"]
    assert "never drafted" in acceptance.never_drafted_lines(records.assign(drafted=[0, 0, 0]))[0]


def test_every_draw_uses_the_seeded_stream_when_no_generator_is_given():
    a, b = SyntheticAcceptance(parse_rates("0.5"), seed=4), SyntheticAcceptance(parse_rates("0.5"), seed=4)
    assert [a._true_rank(1, None) for _ in range(20)] == [b._true_rank(1, None) for _ in range(20)]
    assert random.Random(4).random() == SyntheticAcceptance(parse_rates("0.5"), seed=4).rng.random()


# ------------------------------------------------------------------------------------------ chain profiles, portable

def test_reached_counts_the_drafts_after_a_kept_one():
    gen = Generation()
    gen.count_draft(3, 1)  # kept draft 1, rejected draft 2: draft 3 was never reached
    gen.count_draft(2, 2)
    assert gen.reached_per_position == [2, 2, 0] and gen.accepted_per_position == [2, 1, 0]


def test_a_chain_methods_profile_is_estimated_and_drives_synthetic_runs_and_plan(tiny, prompts_file, tmp_path):
    from specbench.methods.sd.drafter import layer_drafter
    from specbench.run import chain_estimate

    result = chain_estimate.estimate(tiny, "pld", str(prompts_file), 4, 40, None)
    assert result["drafted_per_position"][0] > 0
    conditional = result["conditional"]
    assert conditional and all(0 < c <= 1 for c in conditional)
    assert result["per_rank"] == [[c] for c in conditional]
    first = result["accepted_per_position"][0] / result["drafted_per_position"][0]
    assert conditional[0] == pytest.approx(first, abs=1e-5)
    path = tmp_path / "acc" / "pld.yaml"
    from specbench.planning import acceptance as pa

    pa.write(result, path)
    profile_path = chain_estimate.write_profile(result, path)
    assert read(str(path)).conditional == pytest.approx(conditional)  # the YAML drives a synthetic run
    exported = json.loads(profile_path.read_text())
    assert exported["conditional_accept_rates"] == pytest.approx(conditional, abs=1e-6)
    assert read(str(profile_path)).conditional == pytest.approx(conditional, abs=1e-6)
    sd = chain_estimate.estimate(tiny, "sd", str(prompts_file), 2, 24, None, layer_drafter(tiny, [0]))
    assert sd["drafted_per_position"][0] > 0 and sd["method"] == "sd"
    with pytest.raises(SpecbenchError, match="not a chain method"):
        chain_estimate.estimate(tiny, "ppd", str(prompts_file), 2, 24, None)


def test_plan_reads_a_speculation_profile_from_elsewhere(tmp_path):
    from specbench.planning.plan import PlanRequest, plan

    folder = tmp_path / "acc"
    write_speculation_profile(speculation_profile([0.7, 0.5, 0.3], "medusa", "vicuna-7b"), folder / "medusa.json")
    result = plan(PlanRequest("random:vicuna-7b", gpu="a100", acceptance=str(folder), methods=("medusa",),
                              max_size=16, out=tmp_path / "plan"))
    row = result.rows[0]
    assert row.acceptance.endswith("medusa.json") and not row.why_not
    # a chain profile (rank 0 only): the tree is a chain, its tau at most 1 + sum of the marginals
    assert 1.0 < row.tau <= 1 + 0.7 + 0.35 + 0.105 + 1e-6


def test_a_run_exports_each_methods_profile_and_a_synthetic_run_reads_it(tmp_path, prompts_file, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "real"
    result = CliRunner().invoke(app, ["run", "--model", "random:tiny", "--max-new-tokens", "40", "--warmup", "0",
                                      "--dataset", str(prompts_file), "--limit", "3", "--out", str(out), "-m", "pld"])
    assert result.exit_code == 0, result.output
    exported = out / "speculation_profiles" / "pld.json"
    profile = json.loads(exported.read_text())
    assert profile["method"] == "pld" and profile["conditional_accept_rates"]
    assert not (out / "speculation_profiles" / "ar.json").exists()  # ar drafts nothing: no profile
    records = pd.read_csv(out / "records.csv")
    conditional, _ = acceptance.per_position(records[records.method == "pld"])
    assert profile["conditional_accept_rates"][0] == pytest.approx(conditional[0], abs=1e-6)
    out2, result = _run(tmp_path, prompts_file, str(exported), "pld")
    assert result.exit_code == 0, result.output
    block = yaml.safe_load((out2 / "run.yaml").read_text())["synthetic_acceptance"]
    assert block["source"] == f"speculation profile {exported}" and block["checks"]["pld"]["agrees"]
    assert not (out2 / "speculation_profiles").exists()  # a synthetic run's acceptance is stated, not measured


def test_a_method_that_never_drafted_is_an_error_row_not_a_speedup():
    from specbench.report import compact

    summary = pd.DataFrame({"method": ["ar", "pld", "sd"], "dataset": ["d"] * 3, "prompts": [3] * 3,
                            "tokens_per_s": [10.0, 9.5, 12.0], "speedup": [1.0, 0.95, 1.2], "tau": [1.0, 1.0, 1.6],
                            "drafted": [0, 0, 40], "timing": ["ok"] * 3})
    cells = dict(zip(summary.method, compact.table(summary)["speedup vs ar"]))
    assert cells == {"ar": "1.00x", "pld": "ERROR: 0 drafts", "sd": "1.20x"}


def test_plan_prices_chain_methods_from_their_profiles(tmp_path):
    from specbench.planning.plan import PlanRequest, plan

    folder = tmp_path / "acc"
    folder.mkdir()
    (folder / "pld.yaml").write_text(yaml.safe_dump({"method": "pld", "conditional": [0.6, 0.5, 0.4]}))
    (folder / "sd.yaml").write_text(yaml.safe_dump({"method": "sd", "conditional": [0.9, 0.9, 0.9, 0.9],
                                                    "drafter_share": 0.05}))
    (folder / "pearl.yaml").write_text(yaml.safe_dump({"method": "pearl", "conditional": [0.9, 0.9, 0.9, 0.9]}))
    result = plan(PlanRequest("random:vicuna-7b", gpu="a100", acceptance=str(folder),
                              methods=("pld", "sd", "pearl"), out=tmp_path / "plan"))
    rows = {r.method: r for r in result.rows}
    assert rows["pld"].tau <= 1 + 0.6 + 0.3 + 0.12 + 1e-6 and rows["pld"].speedup > 1
    assert rows["pld"].draft_ms == 0 and rows["pld"].tree.startswith("chain of")
    assert rows["sd"].draft_ms > 0 and rows["sd"].tau > rows["pld"].tau
    assert "drafter_share" in rows["pearl"].why_not or rows["pearl"].speedup is None


def test_recommend_predicts_a_chain_method_from_its_estimated_acceptance(tmp_path, monkeypatch):
    from .test_auto_tree import write_profile

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    write_profile(tmp_path)
    (tmp_path / "acceptance" / "tiny").mkdir(parents=True)
    (tmp_path / "acceptance" / "tiny" / "pld.yaml").write_text(yaml.safe_dump({"method": "pld",
                                                                                "conditional": [0.7, 0.6, 0.5]}))
    result = CliRunner().invoke(app, ["recommend", "--model", "random:tiny", "--confirm", "0", "--out", "rec"])
    assert result.exit_code == 0, result.output
    rec = yaml.safe_load((tmp_path / "rec" / "recommendation.yaml").read_text())
    rows = {m["method"]: m for m in rec["methods"]}
    assert rows["pld"]["predicted"] > 1 and rows["pld"]["tree"].startswith("chain of")
    assert rows["sd"].get("predicted") is None and "estimate --method sd" in rows["sd"]["why_not"] or \
        "drafter" in rows["sd"]["why_not"]


def test_another_engine_is_refused_with_synthetic_acceptance(tmp_path, prompts_file):
    result = CliRunner().invoke(app, ["run", "--engine", "openai", "--base-url", "http://127.0.0.1:9", "--dataset",
                                      str(prompts_file), "--out", str(tmp_path / "r"), "--synthetic-acceptance",
                                      "0.8"])
    assert result.exit_code != 0 and "--synthetic-acceptance decides acceptance" in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_random_medusa_heads_have_their_own_vocabulary_projections(tiny, tmp_path):
    """A synthetic run's random Medusa heads take the published shape `plan` prices: each head its own [V, H]
    projection (in the run's dtype), saved and read back as such; the heads' logits come from it, not the LM head."""
    from specbench.methods.medusa import artifact as mh
    from specbench.run.synthetic import MEDUSA_HEADS, random_artifact

    folder = random_artifact("medusa", tiny, tmp_path)
    art = mh.load(folder, tiny)
    own = art.heads.head_weight
    assert own is not None and tuple(own.shape) == (MEDUSA_HEADS, tiny.vocab_size, tiny.model.config.hidden_size)
    assert own.dtype == tiny.dtype and not own.requires_grad
    h = torch.randn(2, tiny.model.config.hidden_size)
    want = (art.heads.states(h) @ own.transpose(1, 2)).float()
    torch.testing.assert_close(art.heads.logits(None, h), want)  # the LM head is not read

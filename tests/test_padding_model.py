"""EMS-SD's padding model (Appendix B): exact vs Monte Carlo, the paper's claims, tau inversion, measured, CLI."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.planning import padding_model as pm
from specbench.cli import app
from specbench.errors import SpecbenchError

cli = CliRunner()


@pytest.mark.parametrize("p,batch,k", [(0.6, 16, 8), (0.9, 8, 8), (0.5, 2, 8), (0.3, 4, 5), (0.8, 24, 3)])
def test_exact_agrees_with_simulation_within_monte_carlo_error(p, batch, k):
    e, s = pm.exact(p, batch, k), pm.simulate(p, batch, k, steps=20000, seed=1)
    # A and M lie in [1, K], so their standard deviation is below K / 2 and the standard error of a mean over
    # 20000 steps below K / 280; 5 standard errors is far from a flaky bound yet catches an off-by-one in K
    tol = 5 * (k / 2) / math.sqrt(20000)
    for key in ("E[A]", "E[M]", "E[P]"):
        assert s[key] == pytest.approx(e[key], abs=tol), key
    assert s["R"] == pytest.approx(e["R"], abs=0.01)


@pytest.mark.parametrize("p", [0.2, 0.5, 0.9])
def test_batch_of_one_has_no_padding(p):
    e = pm.exact(p, 1, 8)
    assert e["R"] == 0 and e["E[P]"] == 0
    assert e["E[M]"] == pytest.approx(e["E[A]"])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.73, 0.9, 0.99])
def test_mean_acceptance_matches_the_truncated_geometric_closed_form(p):
    assert pm.exact(p, 4, 8)["E[A]"] == pytest.approx((1 - p ** 8) / (1 - p))


def test_the_papers_claims_hold_in_the_exact_model():
    # Paper (Appendix B, Figure 7, K = 8): below p = 0.8 with B > 8 the padding ratio exceeds 50%
    assert pm.exact(0.6, 16, 8)["R"] > 0.5  # exact: 62.2%
    assert all(pm.exact(p, b, 8)["R"] > 0.5 for p in (0.5, 0.6, 0.7) for b in (12, 16, 24))
    # ... and even at p = 0.9 about 30% is wasted (exact: 28.7% at B = 8, 28.8% from B = 16 on, as M hits K)
    assert 0.2 < pm.exact(0.9, 8, 8)["R"] < 0.45
    # M and P grow with p and with B; with K limited, higher p lowers R (at B = 8 and up; at B = 2 R peaks near
    # p = 0.7, so the paper's "higher p, lower R" is a large-batch statement)
    for b in (2, 8, 16):
        ms = [pm.exact(p, b, 8)["E[M]"] for p in (0.5, 0.6, 0.7, 0.8, 0.9)]
        assert ms == sorted(ms)
    ps = [pm.exact(p, 4, 8)["E[P]"] for p in (0.5, 0.6, 0.7, 0.8)]
    assert ps == sorted(ps)
    rs = [pm.exact(p, 16, 8)["R"] for p in (0.6, 0.7, 0.8, 0.9)]
    assert rs == sorted(rs, reverse=True)
    rb = [pm.exact(0.7, b, 8)["R"] for b in (1, 2, 4, 8, 16, 24)]
    assert rb == sorted(rb)


@pytest.mark.parametrize("p,batch", [(0.6, 16), (0.7, 8), (0.9, 8), (0.5, 2)])
def test_padding_per_accepted_token_is_the_share_scaled_and_can_pass_100_percent(p, batch):
    """R_acc = E[P] / E[A] (EMS-SD's measured ratios, Fig. 4's 115%) and R = E[P] / E[M] (<= 100%) describe the same
    padding: R_acc = R x E[M] / E[A], and R = R_acc / (1 + R_acc) since E[M] = E[A] + E[P]."""
    e = pm.exact(p, batch, 8)
    assert e["R_acc"] == pytest.approx(e["R"] * e["E[M]"] / e["E[A]"])
    assert e["R"] == pytest.approx(e["R_acc"] / (1 + e["R_acc"]))
    assert e["R"] < 1
    assert pm.exact(0.6, 16, 8)["R_acc"] > 1 and pm.exact(0.7, 8, 8)["R_acc"] > 1  # padding outnumbers tokens kept
    assert pm.simulate(p, batch, 8, steps=20000, seed=2)["R_acc"] == pytest.approx(e["R_acc"], abs=0.05)


@pytest.mark.parametrize("p,k", [(0.05, 8), (0.5, 8), (0.83, 8), (0.97, 8), (0.6, 3)])
def test_accuracy_from_tau_inverts_mean_acceptance(p, k):
    assert pm.accuracy_from_tau(pm.exact(p, 1, k)["E[A]"], k) == pytest.approx(p, abs=1e-9)


def test_accuracy_from_tau_ends_and_refusals():
    assert pm.accuracy_from_tau(1.0, 8) == pytest.approx(0.0, abs=1e-12)
    assert pm.accuracy_from_tau(8.0, 8) == pytest.approx(1.0)
    for tau in (0.9, 8.5):
        with pytest.raises(SpecbenchError, match="outside"):
            pm.accuracy_from_tau(tau, 8)


def test_table_has_a_row_per_p_and_batch():
    rows = pm.table([0.5, 0.9], [1, 8], 8)
    assert [(r["p"], r["B"]) for r in rows] == [(0.5, 1), (0.5, 8), (0.9, 1), (0.9, 8)]
    assert set(rows[0]) == {"p", "B", "E[A]", "E[M]", "E[P]", "R", "R_acc"}


@pytest.mark.parametrize("args", [(1.5, 2, 8), (0.5, 0, 8), (0.5, 2, 0)])
def test_exact_refuses_meaningless_values(args):
    with pytest.raises(SpecbenchError):
        pm.exact(*args)


def _records() -> pd.DataFrame:
    row = {"method": "sd", "dataset": "gsm8k", "batch_size": 4, "batching": "padded", "new_tokens": 30,
           "target_forwards": 10, "kv_padding": 10, "accepted_per_position": "5/9 3/9 1/9"}
    return pd.DataFrame([
        row,
        {**row, "accepted_per_position": "5/9 3/9"},  # a sample that drafted fewer positions: K from the longest
        {**row, "batching": "unpadded", "kv_padding": 0},  # EMS-SD's way: no padding, not this model's business
        {**row, "batch_size": 1, "batching": "-", "kv_padding": 0},
        {**row, "method": "pld", "new_tokens": 50, "kv_padding": 0, "accepted_per_position": "1/2"},  # tau 5 > K 2
    ])


def test_measured_groups_padded_batches_and_sets_the_model_beside_them():
    frame = pm.measured(_records())
    assert list(frame.method) == ["pld", "sd"]
    sd = frame.set_index("method").loc["sd"]
    assert (sd.rows, sd.new_tokens, sd.kv_padding, sd.K) == (2, 60, 20, 4)
    assert sd.tau == pytest.approx(3.0)
    assert sd.R_measured == pytest.approx(20 / (20 + 60))
    assert pm.exact(sd.p, 1, 4)["E[A]"] == pytest.approx(3.0)
    assert sd.R_model == pytest.approx(pm.exact(sd.p, 4, 4)["R"])
    assert sd.R_acc_measured == pytest.approx(20 / 60)  # EMS-SD's form: padding per accepted token
    assert sd.R_acc_model == pytest.approx(pm.exact(sd.p, 4, 4)["R_acc"])
    pld = frame.set_index("method").loc["pld"]
    assert math.isnan(pld.p) and math.isnan(pld.R_model)  # tau outside [1, K]: no model, no error


def test_measured_of_an_old_run_is_empty():
    old = _records().drop(columns=["batch_size", "batching", "kv_padding"])
    frame = pm.measured(old)
    assert frame.empty and list(frame.columns) == pm.MEASURED_COLUMNS


def test_cli_prints_the_model_table_without_loading_a_model(monkeypatch, tmp_path):
    import specbench.core.model.load as models

    def no_model(*a, **k):
        raise AssertionError("estimate --padding loaded a model")

    monkeypatch.setattr(models, "load_model", no_model)
    result = cli.invoke(app, ["estimate", "--padding", "--batch-sizes", "1,8", "--out", str(tmp_path / "pm.csv")])
    assert result.exit_code == 0, result.output
    assert "EMS-SD padding model" in result.output and "E[M]" in result.output
    assert "28.7%" in result.output  # p = 0.9, B = 8
    frame = pd.read_csv(tmp_path / "pm.csv")
    assert len(frame) == 5 * 2 and list(frame.columns) == ["p", "B", "E[A]", "E[M]", "E[P]", "R", "R_acc"]
    assert "40.3%" in result.output and "R_acc" in result.output  # p = 0.9, B = 8: E[P] / E[A]


def test_cli_measured_comparison_from_a_run_folder(tmp_path):
    records = _records().assign(prompt_id="0", turn=0, wall_s=1.0)
    (tmp_path / "run").mkdir()
    records.to_csv(tmp_path / "run" / "records.csv", index=False)
    result = cli.invoke(app, ["estimate", "--padding", "--batch-sizes", "4", "--run", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "measured vs model" in result.output and "25.0%" in result.output


@pytest.mark.parametrize("args,message", [
    (["--accuracy", "1.5"], "--accuracy: each p must be strictly between 0 and 1 (got 1.5)"),
    (["--accuracy", "x"], "--accuracy: expected comma-separated numbers"),
    (["--batch-sizes", "0,4"], "--batch-size: each batch size must be at least 1"),
    (["--max-accept", "0"], "--max-accept must be at least 1"),
    (["--run", "/nonexistent-run"], "no records.csv here"),
])
def test_cli_refuses_bad_values_with_a_clear_message(args, message):
    result = cli.invoke(app, ["estimate", "--padding", *args])
    assert result.exit_code != 0
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output

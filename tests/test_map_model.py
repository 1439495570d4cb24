"""The map's cost model: the per-step rates a run's acceptance gives, the expected steps of a batch (its longest
sample), the rows that thin out as samples finish, the widths measured on the spot, and the error's split into steps
and step cost (small tables worked by hand; no timing asserted)."""

from __future__ import annotations

import pandas as pd
import pytest

from specbench.core.profile_file import load_profile
from specbench.planning.batch_prediction import (batch_ms, chain_rates, expected_max_steps, latency_at_rows,
                                                 simulate_batch)
from specbench.planning.spot_profile import grid_widths, measure_on_the_spot, widths_to_measure
from specbench.report import map_table

from .test_map import _profile  # L(1, w) = 10 + w ms, L(2, w) = 12 + 2w, L(4, w) = 16 + 4w


def test_chain_rates_give_back_the_runs_tau():
    # 47 decode steps; 9 accepted position 1, 5 of those position 2, 2 of those position 3
    rates = chain_rates([9, 5, 2, 0, 0], 47)
    assert rates == pytest.approx([9 / 47, 5 / 9, 2 / 5])  # trailing zeros dropped
    marginal, tau = 1.0, 1.0
    for r in rates:
        marginal *= r
        tau += marginal
    assert tau == pytest.approx(1 + 16 / 47)
    assert chain_rates([0, 0], 10) == [] and chain_rates([3], 0) == []


def test_expected_max_steps_is_the_longest_sample():
    assert expected_max_steps([], [5, 9, 2]) == 9  # nothing accepted: one token a step
    assert expected_max_steps([1.0, 1.0], [6, 9]) == 3  # three tokens a step: 2 and 3 steps, the batch runs 3
    # rate 0.5, two tokens to decode: 1 step (half the time) or 2; the longer of two samples is 2 with chance 3/4
    assert expected_max_steps([0.5], [2], trials=4000) == pytest.approx(1.5, abs=0.05)
    assert expected_max_steps([0.5], [2, 2], trials=4000) == pytest.approx(1.75, abs=0.05)
    # four tokens: E(n) = 1 + E(n-1)/2 + E(n-2)/2, E(1) = 1, E(2) = 1.5, E(3) = 2.25, E(4) = 2.875
    assert expected_max_steps([0.5], [4], trials=4000) == pytest.approx(2.875, abs=0.06)
    assert expected_max_steps([0.5], [30] * 8, seed=3) == expected_max_steps([0.5], [30] * 8, seed=3)  # seeded
    sim = simulate_batch([0.5], [30] * 8)
    assert sim.steps > sim.sample_steps  # the batch waits for its slowest sample
    assert sum(sim.running) == pytest.approx(sim.steps)


def test_constant_tau_without_rates():
    sim = simulate_batch(None, [20, 30], tau=2.0)
    assert (sim.steps, sim.sample_steps, sim.active) == (15.0, 12.5, None)
    assert batch_ms(_profile(), sim, 3, 128) == pytest.approx(15 * (12 + 6))  # every step at L(2, 3)


def test_latency_between_batch_sizes_and_thinning_rows():
    p = _profile()
    assert latency_at_rows(p, 3, 1, 128) == pytest.approx(17.0)  # halfway between L(2, 1) = 14 and L(4, 1) = 20
    assert latency_at_rows(p, 0.5, 2, 128) == pytest.approx(12.0)  # below one row: batch 1
    assert latency_at_rows(p, 8, 1, 128) is None  # past the largest profiled batch size
    # two samples of two tokens at rate 0.5: step 1 has both rows; step 2 runs with chance 3/4, with 4/3 rows on
    # average then (each sample left with chance 1/2, given at least one): 14 + 0.75 x L(4/3, 1) = 14 + 0.75 x 12
    sim = simulate_batch([0.5], [2, 2], trials=4000)
    assert batch_ms(p, sim, 1, 128) == pytest.approx(23.0, abs=0.4)
    assert batch_ms(p, sim, 1, 128, host_ms_per_row=1.0) == pytest.approx(23.0 + 2 + 0.75 * 4 / 3, abs=0.5)


def test_widths_measured_on_the_spot():
    assert widths_to_measure([1.0]) == [1]
    assert widths_to_measure([5.997]) == [1, 2, 4, 5, 6]  # floor and ceiling: interpolated, never extrapolated
    assert widths_to_measure([2.5, 11.0]) == [1, 2, 3, 4, 8, 11]
    # a smaller batch size takes the larger ones' widths too (a batch's late steps have fewer rows)
    assert grid_widths({2: [1.0, 3.5], 8: [6.2]}) == {1: [1, 2, 3, 4, 6, 7], 2: [1, 2, 3, 4, 6, 7],
                                                    8: [1, 2, 4, 6, 7]}


def test_on_the_spot_profile_on_a_tiny_model(tiny, tmp_path):
    said = []
    profile = measure_on_the_spot(tiny, {1: [1, 2], 2: [1, 3]}, [16, 32], repeats=2, warmup=1, advance=said.append)
    # every batch size and KV length in both passes, the second in reverse (a drift moves every point alike)
    first = ["B 1 kv 16", "B 1 kv 32", "B 2 kv 16", "B 2 kv 32"]
    assert said == [f"{x} (first pass)" for x in first] + [f"{x} (second pass)" for x in first[::-1]]
    assert profile.widths == [1, 2] and sorted(profile.curves) == [16, 32]
    assert profile.batches[2].widths == [1, 3]
    assert all(ms > 0 for c in profile.curves.values() for ms in c["median_ms"])
    assert "single" in profile.meta["engines"]["batch 1"]
    (tmp_path / "p.yaml").write_text(profile.to_yaml())
    again = load_profile(tmp_path / "p.yaml")
    assert again.at_batch(2).widths == [1, 3]


def _batch_records(per_position: str | None) -> pd.DataFrame:
    """ar and pld at B = 1 (one prompt each) and B = 2 (one batch of two): 30 decode tokens per sample; pld accepts
    one draft on half its 20 steps. A batch's 0.05 s prefill is shared out among its rows, as records hold it."""
    base = dict(dataset="gsm8k", prompt_tokens=100, new_tokens=31, draft_s=0.0, prefill_tokens=1)
    rows = []
    for size, wall in ((1, 0.5), (2, 0.6)):
        extra = dict(batching="unpadded", batch_id=f"{size}-0-0", batch_wall_s=wall, prefill_s=0.05 / size) \
            if size > 1 else dict(batching="-", latency_s=wall, ttft_s=0.05)
        for _ in range(size):
            rows.append(dict(base, method="ar", batch_size=size, target_forwards=31, target_tokens=130, **extra))
            rows.append(dict(base, method="pld", batch_size=size, target_forwards=21, target_tokens=140,
                             accepted_per_position=per_position, **extra))
    return pd.DataFrame(rows)


def test_map_table_prices_the_longest_sample_and_splits_the_error():
    frame = map_table.table(_batch_records("10/20"), None, {}, _profile())
    pld2 = frame[(frame.method == "pld") & (frame.batch_size == 2)].iloc[0]
    assert pld2.steps_measured == 20 and pld2.steps_predicted > 20  # a mean tau of 1.5 would say 20
    assert pld2.step_ms_measured == pytest.approx(1000 * 0.55 / 20)
    for r in frame.itertuples():  # the split multiplies back to the tok/s error
        assert 1 + r.error == pytest.approx(1 / ((1 + r.steps_error) * (1 + r.step_cost_error)))
        assert r.within_goal == (abs(r.error) <= map_table.GOAL)
    ar2 = frame[(frame.method == "ar") & (frame.batch_size == 2)].iloc[0]
    assert ar2.steps_predicted == 30 and ar2.step_ms_predicted == pytest.approx(14.0)
    # without per-position counts the constant tau stands in: 20 steps
    plain = map_table.table(_batch_records(None), None, {}, _profile())
    assert plain[(plain.method == "pld") & (plain.batch_size == 2)].steps_predicted.iloc[0] == pytest.approx(20)


def test_grid_needs_reads_each_points_width_and_kv():
    needs, kvs = map_table.grid_needs(_batch_records("10/20"))
    assert needs == {1: [1.0, 2.0], 2: [1.0, 2.0]} and kvs == [128]


def test_a_drafter_is_priced_on_its_own_curve_over_the_rows_still_drafting():
    from specbench.planning.batch_prediction import DraftCost, batch_cost, first_draft_width

    p = _profile()  # as the drafter's curve too: L_d(1, w) = 10 + w, L_d(2, w) = 12 + 2w
    # two forwards a step, the first catching up on 1.5 tokens a row: L_d(2, 1.5) + L_d(2, 1) = 15 + 14
    assert DraftCost(p, 2.0, 1.5, 128).ms(2) == pytest.approx(29.0)
    assert DraftCost(p, 1.0, 1.0, 128).ms(1) == pytest.approx(11.0)
    assert DraftCost(p, 0.5, 1.0, 128).ms(1) == pytest.approx(5.5)  # a forward every other step
    assert DraftCost(p, 1.0, 1.0, 128).ms(8) is None  # past the drafter curve's batch sizes
    # every draft accepted with chance 0.8 x 0.5: the first forward feeds the last draft and the bonus token then
    assert first_draft_width([0.8, 0.5], 2) == pytest.approx(1.4)
    assert first_draft_width([0.8], 2) == 1.0 and first_draft_width(None, 1) == 1.0
    # constant tau, 15 steps of two rows: forward L(2, 3) = 18, drafting L_d(2, 1) = 14, host 2 x 0.5 per step
    sim = simulate_batch(None, [20, 30], tau=2.0)
    cost = batch_cost(p, sim, 3, 128, draft_ms=99.0, host_ms_per_row=0.5, drafter=DraftCost(p, 1.0, 1.0, 128))
    assert (cost.forward_ms, cost.draft_ms, cost.host_ms) == pytest.approx((15 * 18, 15 * 14, 15 * 1.0))
    assert cost.total_ms == pytest.approx(batch_ms(p, sim, 3, 128, 99.0, 0.5, DraftCost(p, 1.0, 1.0, 128)))
    assert batch_cost(p, sim, 3, 128, draft_ms=4.0).draft_ms == pytest.approx(15 * 4.0)  # no curve: as measured


def _sd_records() -> pd.DataFrame:
    """sd at B = 2 (one batch of two): 20 decode steps, one draft a step, the batch's drafting shared out unequally
    between its rows (0.03 s and 0.01 s: 2 ms a step in all)."""
    base = dict(dataset="gsm8k", prompt_tokens=100, new_tokens=31, prefill_tokens=1, batching="unpadded",
                batch_id="2-0-0", batch_wall_s=0.6, prefill_s=0.025, target_forwards=21, target_tokens=140,
                draft_forwards=21, accepted_per_position="10/20")
    rows = [dict(base, method="sd", batch_size=2, draft_s=s) for s in (0.03, 0.01)]
    rows += [dict(base, method="sd", batch_size=1, batching="-", batch_id=None, draft_s=0.02, latency_s=0.5,
                  ttft_s=0.05)]
    return pd.DataFrame(rows)


def test_map_table_sums_a_batchs_drafting_and_prices_the_drafter_on_the_spot():
    frame = map_table.table(_sd_records(), None, {}, _profile())
    sd2 = frame[frame.batch_size == 2].iloc[0]
    assert sd2.draft_ms_per_step == pytest.approx(2.0)  # both rows' shares, not one
    assert sd2.step_ms_measured == pytest.approx(1000 * (0.6 - 0.05) / 20)  # the whole prefill out, not one share
    unequal = _sd_records().assign(prefill_s=[0.04, 0.01, 0.0])  # shares by new tokens need not be equal
    again = map_table.table(unequal, None, {}, _profile())
    assert again[again.batch_size == 2].step_ms_measured.iloc[0] == pytest.approx(sd2.step_ms_measured)
    assert sd2.draft_priced == "measured" and sd2.draft_ms_predicted == pytest.approx(2.0)
    assert sd2.draft_forwards_per_step == pytest.approx(1.0)
    priced = map_table.table(_sd_records(), None, {}, _profile(), drafter=_profile())
    sd2 = priced[priced.batch_size == 2].iloc[0]
    assert sd2.draft_priced == "drafter curve"
    # one forward a step at width 1.5 (its one draft accepted half the time): L_d(1, 1.5) = 11.5 with
    # one row left, L_d(2, 1.5) = 15 with both
    assert 11.5 < sd2.draft_ms_predicted <= 15.0 + 1e-9
    assert sd2.step_ms_predicted == pytest.approx(sd2.forward_ms_predicted + sd2.draft_ms_predicted
                                                  + sd2.host_ms_predicted)
    ar_like = map_table.table(_batch_records("10/20"), None, {}, _profile(), drafter=_profile())
    assert set(ar_like.draft_priced) == {""}  # no drafter forwards: nothing priced on the drafter's curve


def test_drafter_widths_cover_every_batch_size():
    from specbench.planning.spot_profile import drafter_widths

    assert drafter_widths([2, 8]) == {1: [1, 2], 2: [1, 2], 8: [1, 2]}


def test_a_drafters_curve_on_the_spot_on_a_tiny_model(tiny):
    from specbench.methods.sd.drafter import layer_drafter
    from specbench.planning.spot_profile import drafter_widths

    drafter = layer_drafter(tiny, [0])
    profile = measure_on_the_spot(drafter, drafter_widths([2]), [16], repeats=2, warmup=1, pick=True)
    assert profile.widths == [1, 2] and profile.batches[2].widths == [1, 2]
    assert all(ms > 0 for c in profile.curves.values() for ms in c["median_ms"])
    assert "draft steps" in profile.meta["measured_for"]


def test_a_drafters_host_work_is_measured_at_batch_1_and_charged_per_step():
    """sd's drafting outside its drafter's forwards (cache rollback, segments): batch 1's measured drafting less the
    drafter curve's price of it, added once a step at every batch size (issue 51: it was left unpriced; stop 57's
    map measured it at 1.2-1.9 ms a step at B = 1 to 8, not growing with the rows)."""
    from specbench.planning.batch_prediction import DraftCost

    p = _profile()  # the drafter's curve: L_d(1, w) = 10 + w, L_d(2, w) = 12 + 2w
    assert DraftCost(p, 1.0, 1.0, 128, host_ms=2.0).ms(2) == pytest.approx(14.0 + 2.0)
    records = _sd_records()
    single = records.batch_size == 1
    curve_price = map_table.table(records, None, {}, _profile(), drafter=_profile())
    sd1 = curve_price[curve_price.batch_size == 1].iloc[0]
    assert sd1.draft_host_ms == 0  # 1 ms a step measured, the curve prices more: nothing added
    dear = records.assign(draft_s=records.draft_s.where(~single, 0.4))  # 20 ms a step at batch 1
    frame = map_table.table(dear, None, {}, _profile(), drafter=_profile())
    sd1, sd2 = (frame[frame.batch_size == b].iloc[0] for b in (1, 2))
    extra = 20.0 - DraftCost(p, 1.0, map_table.first_draft_width(map_table._rates(dear[single]), 1.0), sd1.kv).ms(1)
    assert sd1.draft_host_ms == pytest.approx(extra) and extra > 0
    assert sd1.draft_ms_predicted == pytest.approx(20.0)  # batch 1: the measured drafting, by construction
    before = curve_price[curve_price.batch_size == 2].iloc[0]
    assert sd2.draft_ms_predicted - before.draft_ms_predicted == pytest.approx(extra)  # once a step at B = 2


def test_a_compiled_runs_map_never_predicts_from_the_eager_profile_that_stood_in(tmp_path):
    """A compiled run without a compiled profile used the eager one, flagged as standing in: the map predicts nothing
    from it (eager steps are not the compiled run's) and says why; an unflagged profile is read."""
    from specbench.core.lookup import EAGER_FOR_COMPILED
    from specbench.planning.profile import save

    path = save(_profile(), tmp_path / "eager.yaml")
    entry = {"kind": "profile", "path": str(path), "flags": [EAGER_FOR_COMPILED]}
    profile, why = map_table.run_profile(tmp_path, {"data_files": {"used": [entry]}})
    assert profile is None and "compiled" in why and "profile --compile --batch-size" in why
    profile, source = map_table.run_profile(tmp_path, {"data_files": {"used": [{**entry, "flags": []}]}})
    assert profile is not None and profile.batch_sizes == [1, 2, 4] and source == str(path)

"""Issue 41 §3, statistics with the right unit: re-timing that cannot cherry-pick one label, an outlier test that
knows a forward's width, the whole turn as the outlier test's "every label was slow" reference with --batching
both, and bootstrap intervals that resample the independent unit (a prompt at batch 1, a batch at B > 1)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from specbench.run import intervals as robust
from specbench.report.summary import summarize
from specbench.run import noise, retime
from specbench.run.records import TurnResult


# ----------------------------------------------------------------------------------------------------- re-timing
def turn(label: str, seconds: float, forwards: int = 10, drafted: int = 0, order: int = 0) -> TurnResult:
    gen = SimpleNamespace(tokens=[1, 2, 3], target_forwards=forwards, drafted=drafted)
    return TurnResult(label, 0, None, gen, seconds, 1.0, {"foreign_cpu": float("nan")}, order)


def quiet_history() -> retime.History:
    """Three kept turns: ar at 100 ms a forward, pld at 50 ms."""
    history = retime.History()
    for s in (1.0, 1.05, 0.95):
        history.keep("d", {"ar": turn("ar", s), "pld": turn("pld", s / 2)})
    return history


def test_a_method_slow_for_real_on_a_prompt_keeps_its_slow_time():
    """pld is 3x its usual forward time on this prompt on every try (a real property of the prompt, not noise):
    every try flags it, so no try is wholly quiet. The kept timing of each label is its median over the tries,
    not pld's fastest draw (which the fewest-disturbed-seconds rule picked, while ar kept whatever it drew)."""
    tries = {"ar": iter([1.1, 0.9]), "pld": iter([1.35, 1.5])}
    results = {"ar": [turn("ar", 1.0)], "pld": [turn("pld", 1.65, order=1)]}
    retime.heal_prompt(lambda label, first, position: turn(label, next(tries[label]), order=position), "d", results,
                       ["ar", "pld"], quiet_history(), retime=2)
    pld, ar = results["pld"][0], results["ar"][0]
    assert pld.tries == ar.tries == 3
    assert pld.seconds == 1.5  # the median of 1.65, 1.35, 1.5: not 1.35
    assert ar.seconds == 1.0  # the median of ar's own tries
    assert pld.disturbed and not ar.disturbed  # still an outlier: flagged for the noise guard, not hidden


def test_a_wholly_quiet_try_is_kept_for_every_label():
    results = {"ar": [turn("ar", 3.0)], "pld": [turn("pld", 0.5, order=1)]}  # ar 3x: disturbed
    retime.heal_prompt(lambda label, first, position: turn(label, 1.0 if label == "ar" else 0.52, order=position),
                       "d", results, ["ar", "pld"], quiet_history(), retime=2)
    assert results["ar"][0].seconds == 1.0 and results["pld"][0].seconds == 0.52  # the second try, both labels
    assert results["ar"][0].tries == 2 and not results["ar"][0].disturbed


def test_retime_judges_a_forward_at_its_width():
    """A pld turn whose forwards verify 11 tokens each takes 2x its narrow median per forward, and is quick per
    token verified: not an outlier, so not re-timed."""
    history = quiet_history()
    calls = []
    results = {"ar": [turn("ar", 1.0)], "pld": [turn("pld", 1.0, drafted=100, order=1)]}  # 100 ms, width 11
    retime.heal_prompt(lambda *a: calls.append(a), "d", results, ["ar", "pld"], history, retime=2)
    assert calls == [] and not results["pld"][0].disturbed


# ---------------------------------------------------------------------------------------------- the outlier test
def pld_frame(prompts: int = 6) -> pd.DataFrame:
    """ar (100 ms a forward) and pld on `prompts` prompts: pld drafts little (width 1.75) except on the last prompt,
    an extraction prompt where it verifies 11 tokens a forward at tau 6.6 and is 3.44x ar, for real."""
    rows = []
    for i in range(prompts):
        base = {"dataset": "d", "prompt_id": str(i), "turn": 0, "new_tokens": 100, "lossless": "", "peak_mem_mb": 1.0,
                "accepted_drafts": 0, "foreign_cpu": 0.0, "steal": 0.0}
        rows.append({**base, "method": "ar", "wall_s": 10.0, "target_forwards": 100, "drafted": 0})
        wide = i == prompts - 1
        rows.append({**base, "method": "pld", "wall_s": 10 / 3.44 if wide else 8.0,
                     "target_forwards": 15 if wide else 67, "drafted": 150 if wide else 50})
    frame = pd.DataFrame(rows)
    frame["tokens_per_s"] = frame.new_tokens / frame.wall_s
    frame["forward_ms"] = 1e3 * frame.wall_s / frame.target_forwards
    return frame


def test_a_genuine_fast_row_of_a_wide_drafting_method_is_not_an_outlier():
    frame = pld_frame()
    wide = (frame.method == "pld") & (frame.prompt_id == "5")
    median = frame[(frame.method == "pld") & ~wide].forward_ms.median()
    assert frame[wide].forward_ms.iloc[0] > 1.5 * median  # per forward it looks like a disturbed row
    assert not noise.flag_rows(frame).row_outlier.any()
    row = summarize(frame).set_index("method").loc["pld"]
    assert row.timing == "ok"


def test_a_slow_narrow_row_is_still_an_outlier():
    frame = pld_frame()
    slow = (frame.method == "pld") & (frame.prompt_id == "2")
    frame.loc[slow, ["wall_s", "forward_ms"]] *= 2.5
    flagged = noise.flag_rows(frame)
    assert flagged[flagged.row_outlier][["method", "prompt_id"]].values.tolist() == [["pld", "2"]]


def batched_frame(modes=("unpadded", "padded"), prompts: int = 5, size: int = 4) -> pd.DataFrame:
    """--batching both at B=4: ar in one mode (unpadded), sd in both; every label slow (2x) on prompt 3's turn."""
    rows = []
    for i in range(prompts):
        for method, mode in [("ar", "unpadded")] + [("sd", m) for m in modes]:
            fwd = (40.0 if method == "ar" else 60.0) * (2 if i == 3 else 1)
            rows.append({"method": method, "batching": mode, "batch_size": size, "batch_id": f"{size}-{i // size}-0",
                         "dataset": "d", "prompt_id": str(i), "turn": 0, "new_tokens": 100, "wall_s": fwd / 10,
                         "target_forwards": 100, "drafted": 0, "forward_ms": fwd, "foreign_cpu": 0.0, "steal": 0.0,
                         "lossless": "", "accepted_drafts": 0, "peak_mem_mb": 1.0})
    frame = pd.DataFrame(rows)
    frame["tokens_per_s"] = frame.new_tokens / frame.wall_s
    return frame


def test_batching_both_a_turn_slow_for_every_label_is_not_an_outlier_in_either_mode():
    flagged = noise.flag_rows(batched_frame())
    assert not flagged.row_outlier.any(), flagged[flagged.row_outlier][["method", "batching", "prompt_id"]]
    only_padded = batched_frame()
    slow = (only_padded.batching == "padded") & (only_padded.prompt_id == "1")
    only_padded.loc[slow, "forward_ms"] *= 2
    flagged = noise.flag_rows(only_padded)
    assert flagged[flagged.row_outlier][["method", "batching", "prompt_id"]].values.tolist() == [["sd", "padded", "1"]]


# --------------------------------------------------------------------------------------- the bootstrap's unit
def batch_records(batches: int = 6, size: int = 4, copies: int = 1, seed: int = 3) -> pd.DataFrame:
    """ar and sd at B=`size`, unpadded: each batch's time drawn once per label (every sample of a batch shares
    it: a sample's wall_s is its share); `copies` repeats each sample of a batch (as another prompt) that often."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in range(batches):
        times = {"ar": 10.0 * rng.uniform(0.9, 1.1), "sd": 10.0 / rng.uniform(1.1, 1.9)}
        for s in range(size):
            for c in range(copies):
                for method, t in times.items():
                    rows.append({"method": method, "batching": "unpadded", "batch_size": size,
                                 "batch_id": f"{size}-{b}-0", "dataset": "d", "prompt_id": f"{b * size + s}.{c}",
                                 "turn": 0, "new_tokens": 100, "wall_s": t / size, "target_forwards": 100,
                                 "drafted": 0, "forward_ms": 1e3 * t / 100, "foreign_cpu": 0.0, "steal": 0.0,
                                 "lossless": "", "accepted_drafts": 0, "peak_mem_mb": 1.0})
    frame = pd.DataFrame(rows)
    frame["tokens_per_s"] = frame.new_tokens / frame.wall_s
    return frame


def width(summary: pd.DataFrame, method: str = "sd") -> float:
    row = summary.set_index("method").loc[method]
    return float(row.speedup_hi - row.speedup_lo)


def test_repeating_each_batchs_samples_does_not_narrow_the_interval():
    once, four = summarize(batch_records()), summarize(batch_records(copies=4))
    assert width(once) > 0.05
    assert width(four) >= width(once) - 1e-9  # the same 6 batches: no more information


def multi_turn_records(turns: int) -> pd.DataFrame:
    """ar and pld at batch 1 on 8 prompts, each prompt's speedup drawn once and shared by its `turns` turns (a
    prompt's turns are correlated: the same task, the same drafting luck)."""
    rng = np.random.default_rng(5)
    rows = []
    for p in range(8):
        ratio = rng.uniform(1.0, 2.0)
        for t in range(turns):
            for method, wall in (("ar", 10.0), ("pld", 10.0 / ratio)):
                rows.append({"method": method, "dataset": "d", "prompt_id": str(p), "turn": t, "new_tokens": 100,
                             "wall_s": wall, "tokens_per_s": 100 / wall, "target_forwards": 100, "drafted": 0,
                             "accepted_drafts": 0, "lossless": "", "peak_mem_mb": 1.0, "foreign_cpu": 0.0,
                             "steal": 0.0})
    return pd.DataFrame(rows)


def test_a_prompts_turns_are_resampled_together():
    one, three = summarize(multi_turn_records(1)), summarize(multi_turn_records(3))
    assert width(one, "pld") > 0.05
    assert width(three, "pld") >= width(one, "pld") - 1e-9


def test_the_unit_is_the_prompt_at_batch_1_and_the_batch_group_at_b_above_1():
    recs = multi_turn_records(2)
    pairs = robust.turn_pairs(recs[recs.method == "pld"], recs[recs.method == "ar"], ["dataset", "prompt_id", "turn"])
    assert pairs.unit.nunique() == 8 and len(pairs) == 16
    batched = batch_records()
    pairs = robust.turn_pairs(batched[batched.method == "sd"], batched[batched.method == "ar"],
                              ["dataset", "prompt_id", "turn"])
    assert pairs.unit.nunique() == 6 and len(pairs) == 24

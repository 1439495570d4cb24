"""Batch > 1 (EMS-SD): the unpadded and padded engines compute what one-at-a-time decoding computes, every batchable
method (every method but pearl) is lossless per sample in both modes at B = 2, 4, 8 with and without refill (B = 1:
test_methods.py), tree methods draft at B > 1 what they draft at B = 1, sampling keeps the target's distribution,
padding is counted, and the runner's batch options, refusals, records and resume."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from specbench.run import resume as runner_module
from specbench.cli import app
from specbench.core.batch.cache import new_cache
from specbench.core.batch.forward import forward
from specbench.core.batch.padded import PaddedBatch
from specbench.core.batch.ragged import RaggedCache, Segment, ragged_forward
from specbench.core.verify import Sampling
from specbench.methods.sd.drafter import layer_drafter
from specbench.methods import REGISTRY, get_method
from specbench.methods.batch_loop import generate_batch

from .conftest import artifact_options, prompt_ids
from .test_sd import SAMPLING, exact_distribution, tv

BATCHABLE = sorted(n for n, c in REGISTRY.items() if c.batchable)
TREE_METHODS = sorted(n for n, c in REGISTRY.items() if c.kind == "tree" and not c.typical)  # -typical: same drafts
PROMPTS = [prompt_ids(seed, length=6 + 3 * seed) for seed in range(5)]  # lengths differ: padding has work to do


def single(model, prompt: list[int], more: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One sample alone: the prompt's last logits [V] and the logits of `more` fed after it [len(more), V]."""
    cache = new_cache(model)
    return forward(model, torch.tensor([prompt]), cache)[-1], forward(model, torch.tensor([more]), cache)


def test_unpadded_forward_matches_one_sample_at_a_time(tiny):
    model = tiny.model
    prompts = [p[0].tolist() for p in PROMPTS[:3]]
    cache = RaggedCache(3)
    first = ragged_forward(model, cache, [Segment(i, p, keep=1) for i, p in enumerate(prompts)])
    assert cache.lengths == [len(p) for p in prompts]
    # widths differ and slots come out of order: each sample still sees only its own cache
    more = {0: [5, 6, 7, 8], 1: [9], 2: [10, 11]}
    step = ragged_forward(model, cache, [Segment(2, more[2]), Segment(0, more[0]), Segment(1, more[1])])
    for slot, got in zip((2, 0, 1), step):
        last, expected = single(model, prompts[slot], more[slot])
        assert torch.allclose(first[slot][-1], last, atol=1e-5)
        assert torch.allclose(got, expected, atol=1e-5)
    # rollback is a length change: drop slot 0's last two entries, feed others in their place
    cache.truncate(0, len(prompts[0]) + 2)
    again = ragged_forward(model, cache, [Segment(0, [3, 4])])[0]
    assert torch.allclose(again, single(model, prompts[0], [5, 6, 3, 4])[1][2:], atol=1e-5)


def test_padded_forward_matches_one_sample_at_a_time(tiny):
    model = tiny.model
    prompts = {i: p[0].tolist() for i, p in enumerate(PROMPTS[:3])}
    batch = PaddedBatch(model, torch.device("cpu"))
    first = batch.admit([Segment(s, p, keep=1) for s, p in prompts.items()])
    more = {0: [5, 6, 7, 8], 1: [9], 2: [10, 11]}
    step = batch.step([Segment(s, more[s]) for s in (2, 0, 1)])
    for slot, got in zip((2, 0, 1), step):
        last, expected = single(model, prompts[slot], more[slot])
        assert torch.allclose(first[slot][-1], last, atol=1e-5)
        assert torch.allclose(got, expected, atol=1e-5)
    longest = max(len(p) for p in prompts.values())
    assert batch.padding_tokens == {s: longest - len(p) + 4 - len(more[s]) for s, p in prompts.items()}
    # slot 0 keeps 2 of its 4 new entries: the batch keeps the longest (2, slot 2's), slot 1 pads 1; a sample leaves
    batch.truncate(0, len(prompts[0]) + 2)
    assert batch.width == longest + 2
    assert (batch.kv_padding(0), batch.kv_padding(1), batch.kv_padding(2)) == (0, 1, 0)
    batch.release(2)
    again = batch.step([Segment(0, [3]), Segment(1, [4])])
    assert torch.allclose(again[0], single(model, prompts[0], [5, 6, 3])[1][2:], atol=1e-5)
    assert torch.allclose(again[1], single(model, prompts[1], [9, 4])[1][1:], atol=1e-5)


def test_tree_segments_and_compaction_match_one_sample_at_a_time(tiny):
    """A segment with its own embeddings, tree mask and positions (ppd's step), then keeping one branch: both
    engines give the hidden states and the cache that one sample alone gives."""
    from specbench.methods.batch_loop import engine

    model = tiny.model
    prompts = [p[0].tolist() for p in PROMPTS[:2]]
    # a 3-node tree: root r, two children a and b of r (siblings: b must not see a), at positions past, past+1, past+1
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    tokens = [7, 8, 9]
    for mode in ("unpadded", "padded"):
        batch = engine(model, mode, 2, torch.device("cpu"))
        batch.forward([Segment(i, p, keep=1) for i, p in enumerate(prompts)], [])
        past = [batch.lengths[i] for i in range(2)]
        embeds = model.get_input_embeddings()(torch.tensor(tokens))
        segs = [Segment(i, tokens, positions=[past[i], past[i] + 1, past[i] + 1], mask=tree, embeds=embeds)
                for i in range(2)]
        _, hidden = batch.forward([], segs, hidden=True)
        for i in range(2):
            alone_a = single(model, prompts[i], [7, 8])[1]  # the branch r -> a
            alone_b = single(model, prompts[i], [7, 9])[1]  # the branch r -> b
            head = model.get_output_embeddings()
            assert torch.allclose(head(hidden[i][:2]), alone_a, atol=1e-4), mode
            assert torch.allclose(head(hidden[i][2]), alone_b[1], atol=1e-4), mode
            batch.keep_offsets(i, past[i], [0, 2])  # accept r -> b: b moves next to r
        _, after = batch.forward([], [Segment(i, [5]) for i in range(2)])
        for i in range(2):
            assert torch.allclose(after[i], single(model, prompts[i], [7, 9, 5])[1][2:], atol=1e-4), mode


def build(name: str, target, extra: dict | None = None):
    cls = get_method(name)
    options = {**({"gamma": 3} if name == "sd" else artifact_options(name, target)), **(extra or {})}
    return cls(target, options, layer_drafter(target, [0]) if "drafter" in cls.needs else None)


@pytest.mark.parametrize("name", BATCHABLE)
@pytest.mark.parametrize("mode", ["unpadded", "padded"])
@pytest.mark.parametrize("slots,refill", [(2, False), (4, True), (8, False)])
def test_every_sample_equals_batch_one_ar(tiny, name, mode, slots, refill):
    reference = [build("ar", tiny).generate(p, 40, Sampling(), None).tokens for p in PROMPTS]
    gens, steps = generate_batch(build(name, tiny), PROMPTS, slots, mode, refill, 40, Sampling(), [None] * 5)
    assert [g.tokens for g in gens] == reference
    assert steps >= 40 / 10  # fewer steps than tokens only by drafting, never zero
    padding = sum(g.padding_tokens for g in gens)
    assert padding == 0 if mode == "unpadded" else padding > 0  # the prompts' lengths differ
    assert all(g.target_tokens >= g.padding_tokens + len(g.tokens) for g in gens)


def test_every_method_but_pearl_batches():
    assert set(REGISTRY) - set(BATCHABLE) == {"pearl", "pearl-no-pre", "pearl-no-post"}


@pytest.mark.parametrize("name", TREE_METHODS)
@pytest.mark.parametrize("mode", ["unpadded", "padded"])
def test_tree_methods_draft_at_batch_size_three_what_they_draft_alone(tiny, name, mode):
    """Each sample's trees come out of the batched step as batch 1 drafts them: the same accepted lengths step by
    step (ppd's prompt tokens, Medusa's heads, Hidden Transfer's pseudo positions placed per segment, eagle's and
    parallelspec's drafter caches as slots of the drafter's batch engine), and for a drafter model the same drafter
    forwards."""
    method = build(name, tiny)
    alone = [method.generate(p, 24, Sampling(), None) for p in PROMPTS]
    gens, _ = generate_batch(method, PROMPTS, 3, mode, True, 24, Sampling(), [None] * 5)
    assert [g.tokens for g in gens] == [g.tokens for g in alone]
    assert [g.accepted_lengths for g in gens] == [g.accepted_lengths for g in alone]
    assert [g.draft_forwards for g in gens] == [g.draft_forwards for g in alone]
    drafts_with_a_model = method.proposer.drafter_model or method.proposer.advance_drafts  # Medusa: its heads
    assert (sum(g.draft_s for g in gens) > 0) == drafts_with_a_model


@pytest.mark.parametrize("name", [n for n in BATCHABLE if n != "ar"])
def test_every_method_samples_at_batch_size_three(tiny, name):
    """T > 0 at B > 1 runs for every drafting method, refilled, in both modes, and each sample's own random stream
    alone decides its tokens: the seeds of batch 1 give batch 1's tokens in either mode (sd's batch 1 draws its
    first token in its first verify, the batch in a prefill of its own: its streams differ in order, not in law).
    suffix runs on each prompt's own index here: its global index drafts from whatever finished before (the batch's
    other prompts), and other trees consume the random stream differently (test_suffix.py batches it with it)."""
    method = build(name, tiny, {"suffix_global": "off"} if name == "suffix" else None)
    alone = [method.generate(p, 12, SAMPLING, torch.Generator().manual_seed(i)).tokens for i, p in enumerate(PROMPTS)]
    for mode in ("unpadded", "padded"):
        gens, _ = generate_batch(method, PROMPTS, 3, mode, True, 12, SAMPLING,
                                 [torch.Generator().manual_seed(i) for i in range(5)])
        assert all(0 < len(g.tokens) <= 12 for g in gens)
        if name != "sd":
            assert [g.tokens for g in gens] == alone, mode


def test_unpadded_ar_feeds_each_token_once(tiny):
    gens, _ = generate_batch(build("ar", tiny), PROMPTS, 4, "unpadded", False, 20, Sampling(), [None] * 5)
    for g, p in zip(gens, PROMPTS):  # the prompt, then every token but the last
        assert g.target_tokens == p.shape[1] + len(g.tokens) - 1


def test_refill_keeps_the_slots_busy(tiny):
    """With refill a finished sample's slot takes the next prompt at once. Prompt 0's first token made a stop token:
    batch after batch takes 3 x 30 steps (0+1, 2+3, 4); refilled, prompt 2 starts at step 2 and the whole set ends
    sooner. The tokens are the same either way."""
    first = build("ar", tiny).generate(PROMPTS[0], 1, Sampling(), None).tokens[0]
    target = dataclasses.replace(tiny, tokenizer=dataclasses.replace(tiny.tokenizer, stop_ids=(first,)))
    method = build("ar", target)
    alone = [method.generate(p, 30, Sampling(), None).tokens for p in PROMPTS]
    assert len(alone[0]) == 1 and all(len(t) == 30 for t in alone[1:]), "the test needs one early stop only"
    plain, plain_steps = generate_batch(method, PROMPTS, 2, "unpadded", False, 30, Sampling(), [None] * 5)
    refilled, refilled_steps = generate_batch(method, PROMPTS, 2, "unpadded", True, 30, Sampling(), [None] * 5)
    assert [g.tokens for g in plain] == [g.tokens for g in refilled] == alone
    assert plain_steps == 3 * 30 and refilled_steps == 1 + 30 + 30  # p2 joins at step 2, p3 at 31, p4 at 32


@pytest.mark.parametrize("name", ["sd", "ppd", "eagle"])
@pytest.mark.parametrize("mode", ["unpadded", "padded"])
def test_batched_sampling_preserves_target_distribution(tiny, name, mode):
    """Eight samples of one prompt side by side, each on its own random stream, 100 batches: the 2-token
    continuations follow the target's exact distribution (the batch-1 test's bound, test_sd.py); sd's speculative
    sampling, ppd's multi-candidate tree sampling and eagle's (candidates sampled from the batched drafter's q)
    alike."""
    options = {"gamma": 2} if name == "sd" else {**artifact_options(name, tiny), "tree": "size=12"}
    sd = get_method(name)(tiny, options, layer_drafter(tiny, [0]) if name == "sd" else None)
    ids = prompt_ids(0)[:, :20]
    exact = exact_distribution(tiny.model, ids, SAMPLING, 2)
    counts: dict[tuple, int] = {}
    for b in range(100):
        gens, _ = generate_batch(sd, [ids] * 8, 8, mode, False, 2, SAMPLING,
                                 [torch.Generator().manual_seed(b * 8 + i) for i in range(8)])
        for g in gens:
            counts[tuple(g.tokens)] = counts.get(tuple(g.tokens), 0) + 1
    distance = tv({k: v / 800 for k, v in counts.items()}, exact)
    assert distance < 0.1, f"TV {distance:.3f} between batched sd samples and the target distribution"


# ------------------------------------------------------------------------------------------------- the runner

cli = CliRunner()
TINY = ["--model", "random:tiny", "--max-new-tokens", "16", "--warmup", "0"]


def invoke(*args):
    return cli.invoke(app, [str(a) for a in args])


def test_batched_run_records_and_summary(tmp_path, prompts_file):
    out = tmp_path / "run"
    result = invoke("run", *TINY, "--dataset", prompts_file, "--limit", 4, "--batch-size", "2,4", "--out", out)
    assert result.exit_code == 0, result.output
    records = pd.read_csv(out / "records.csv", keep_default_na=False)
    # ar alone at batch 1 (the reference), then ar (unpadded) and pld in both modes at 2 and 4
    assert set(records[records.batch_size == 1].method) == {"ar"}
    batched = records[records.batch_size > 1]
    assert set(zip(batched.method, batched.batching)) == {("ar", "unpadded"), ("pld", "unpadded"),
                                                          ("pld", "padded")}
    assert len(batched) == 2 * 3 * 5  # 4 prompts, one with 2 turns: 5 turns per label and batch size
    assert (batched.lossless == "match").all()
    assert (batched[batched.batching == "unpadded"].padding_tokens == 0).all()
    assert batched[batched.batching == "padded"].padding_tokens.sum() > 0
    # a sample's wall_s is its share of its batch: the shares add up to the batch's time
    for _, g in batched.groupby(["method", "batching", "batch_id"]):
        assert g.wall_s.sum() == pytest.approx(g.batch_wall_s.iloc[0], rel=1e-3)
    summary = pd.read_csv(out / "summary.csv", keep_default_na=False)
    rows = summary[summary.batch_size == 4]
    assert set(zip(rows.method, rows.batching)) == {("ar", "unpadded"), ("pld", "unpadded"), ("pld", "padded")}
    assert float(rows[rows.method == "ar"].speedup.iloc[0]) == 1.0  # each size against ar at that size
    assert "B=4 padded" in result.output
    assert (out / "batching.csv").exists() and (out / "batch_speedup.png").exists()
    assert "## Batching (EMS-SD)" in (out / "report.md").read_text()
    # CI tools key batched rows by their name: a run compared with itself passes, row by row
    gate = invoke("report", out, "--baseline", out, "--fail-regression", 50, "--judge-disturbed",
                  "--junit", tmp_path / "j.xml")
    assert gate.exit_code == 0, gate.output
    assert 'name="specbench.pld B=4 padded"' in (tmp_path / "j.xml").read_text()


@pytest.mark.parametrize("args,message", [
    (["--batch-size", "0"], "--batch-size: sizes must be at least 1"),
    (["--batch-size", "-2"], "--batch-size: sizes must be at least 1"),
    (["--batch-size", "two"], "--batch-size: expected comma-separated integers"),
    (["--batch-size", "4", "--batching", "squeezed"], "--batching 'squeezed': choose unpadded, padded or both"),
    (["--batch-size", "4", "--method", "pearl"],
     "pearl cannot decode batches (--batch-size 4; pearl: its drafter and target run concurrently"),
])
def test_bad_batch_options(tmp_path, args, message):
    result = invoke("run", "--model", "random:tiny", "--out", tmp_path / "r", *args)
    assert result.exit_code != 0
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert not (tmp_path / "r" / "run.yaml").exists()


def test_refill_at_batch_one_and_batches_larger_than_the_data_say_so(tmp_path, prompts_file):
    result = invoke("run", *TINY, "--dataset", prompts_file, "--limit", 1, "--refill", "--out", tmp_path / "a")
    assert result.exit_code == 0 and "--refill does nothing at --batch-size 1" in " ".join(result.output.split())
    result = invoke("run", *TINY, "--dataset", prompts_file, "--limit", 2, "--batch-size", 8, "--batching", "padded",
                    "--out", tmp_path / "b")
    assert result.exit_code == 0, result.output
    assert "batch size(s) 8 run with 2" in " ".join(result.output.split())


def test_ctrl_c_mid_batch_keeps_finished_batches_and_resume_finishes(tmp_path, prompts_file, monkeypatch):
    from specbench.run import batch_schedule as batching

    out = tmp_path / "run"
    real = batching.run_label
    calls = {"n": 0}

    def interrupt_on_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(batching, "run_label", interrupt_on_third)
    args = ["run", *TINY, "--dataset", prompts_file, "--limit", 4, "--batch-size", "1,2", "--out", out]
    result = invoke(*args)
    assert result.exit_code == 130 and "--resume" in result.output
    kept = pd.read_csv(out / "records.csv", keep_default_na=False)
    assert len(kept[kept.batch_size == 2]) == 2 * 2  # two finished batches of two single-turn prompts
    monkeypatch.setattr(batching, "run_label", real)
    resumed = invoke(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    records = pd.read_csv(out / "records.csv", keep_default_na=False)
    assert not records.duplicated(runner_module.DONE_KEY + ["turn"]).any()
    assert len(records[records.batch_size == 2]) == 3 * 5  # ar, pld unpadded, pld padded: 5 turns each

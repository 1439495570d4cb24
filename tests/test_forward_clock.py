"""The engines measure the target's forwards themselves (core/machine/forward_clock.py): the tokens and decoder
calls they count equal what a witness hook on the decoder sees, for every method at batch 1 (eager and on the static
engine), at batch B, and no hook for measurement is left in core/."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specbench.core.batch import static
from specbench.core.batch.cache import new_cache
from specbench.core.batch.decoder import decoder_layers, decoder_module, target_logits, target_logits_at
from specbench.core.batch.engine import engine
from specbench.core.batch.forward import count_fed_tokens, forward
from specbench.core.batch.ragged import Segment
from specbench.core.machine import forward_clock
from specbench.core.machine.forward_clock import IDLE, ForwardClock, clock_of, measuring
from specbench.core.model import compile as cc
from specbench.core.verify import Sampling
from specbench.methods import REGISTRY
from specbench.methods.batch_loop import generate_batch

from .conftest import prompt_ids
from .test_compile_batch import _method, pair  # noqa: F401 (pair: the fixture; one method builder for both)

NEW_TOKENS = 10


class Witness:
    """Test-only hooks on a model's decoder and first layer: the calls and tokens (rows x width) they see."""

    def __init__(self, model):
        self.calls = self.tokens = 0
        first = decoder_layers(model)[0]
        self.handles = [decoder_module(model).register_forward_pre_hook(self._call),
                        first.register_forward_pre_hook(self._fed, with_kwargs=True)]

    def _call(self, _module, _args):
        self.calls += 1

    def _fed(self, _module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        self.tokens += hidden.shape[0] * hidden.shape[1]

    def remove(self):
        for handle in self.handles:
            handle.remove()


def _measured(model, run):
    witness = Witness(model)
    try:
        with torch.inference_mode(), measuring(model) as clock:
            out = run()
        clock.finish()
    finally:
        witness.remove()
    return out, clock, witness


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_method_counts_what_its_target_decoder_is_fed(pair, name):
    """Batch 1, eager: the clock's forwards and tokens are the target decoder's calls and fed tokens (a drafter's
    own forwards, sd's layer-skip drafter sharing the target's head included, are not the target's)."""
    target, drafter = pair
    method = _method(name, target, drafter)
    gen, clock, witness = _measured(target.model, lambda: method.generate(prompt_ids(2), NEW_TOKENS, Sampling(), None))
    assert witness.calls > 0 and len(gen.tokens) > 0
    assert (clock.forwards, clock.tokens) == (witness.calls, witness.tokens)
    assert clock.seconds > 0



@pytest.mark.parametrize("name", ["ar", "ppd", "sd"])
def test_static_engine_counts_its_buckets_around_the_call(pair, name):
    """Batch 1 on the static engine (its step run uncompiled here): each call is one span opened outside the step,
    fed its bucket's width (padding included), as the decoder sees it."""
    target, drafter = pair
    method = _method(name, target, drafter)
    states = [cc.enable(target.model, 256), cc.enable(drafter.model, 256)]
    try:
        for state in states:
            state.fn = static.step
            state.declare(cc.declared_width(method))
        states[0].declare_tree(cc.declared_tree_widths(method))
        method.generate(prompt_ids(0), NEW_TOKENS, Sampling(), None)  # warm-up: the buckets met
        for state in states:
            state.finish_warm_up()
        assert isinstance(engine(target.model, "single", 1, target.device), static.StaticSequence)
        _, clock, witness = _measured(target.model,
                                      lambda: method.generate(prompt_ids(1), NEW_TOKENS, Sampling(), None))
        compiled = states[0].compiled_steps
    finally:
        for state in states:
            cc.disable(state.model)
    assert compiled > 0
    assert (clock.forwards, clock.tokens) == (witness.calls, witness.tokens)


@pytest.mark.parametrize("mode", ["unpadded", "padded"])
def test_batch_engines_count_rows_times_width(pair, mode):
    """Batch B: the packed engine counts its packed tokens, the padded one every row at the widest segment."""
    target, drafter = pair
    method = _method("pld", target, drafter)
    prompts = [prompt_ids(s) for s in range(3)]
    _, clock, witness = _measured(target.model, lambda: generate_batch(
        method, prompts, 2, mode, mode == "unpadded", NEW_TOKENS, Sampling(), [None] * 3))
    assert (clock.forwards, clock.tokens) == (witness.calls, witness.tokens) and clock.forwards > 1


def _spans(clock, monkeypatch):
    opened = []
    real = clock._start
    monkeypatch.setattr(clock, "_start", lambda: (opened.append(1), real())[1])
    return opened


def test_the_head_on_the_engines_output_is_the_targets_forward(tiny, monkeypatch):
    """A method's head call on rows an engine returned (a view) is timed; on a copy of them (gathered rows), on a
    drafter's states or outside a measured block it is not; the engine's own head call is inside its span."""
    one = engine(tiny.model, "single", 1, tiny.device)
    with torch.inference_mode(), measuring(tiny.model) as clock:
        opened = _spans(clock, monkeypatch)
        h = one.forward([Segment(0, prompt_ids(0)[0].tolist())], [], hidden=True)[0][0]  # [w, H]
        assert len(opened) == 1 and clock.forwards == 1
        target_logits(tiny.model, h[-1])
        assert len(opened) == 2
        target_logits(tiny.model, h[[0, 2]])  # gathered: a copy
        target_logits(tiny.model, torch.randn_like(h))
        assert len(opened) == 2
        rows = target_logits_at(tiny.model, h, [2, 0])  # the step's own rows of the output, gathered: timed
        assert len(opened) == 3 and torch.equal(rows, target_logits(tiny.model, h[[2, 0]]))
        target_logits_at(tiny.model, torch.randn_like(h), [0])  # rows of anything else: not
        assert len(opened) == 3
        one.forward([], [Segment(0, [5, 6], keep=2)])  # logits: the head within the span
        assert len(opened) == 4 and clock.forwards == 2 and clock.tokens == h.shape[0] + 2
    assert clock_of(tiny.model) is IDLE


def test_fed_tokens_of_nested_blocks_and_unmeasured_models(tiny):
    with torch.inference_mode(), count_fed_tokens(tiny.model) as outer:
        forward(tiny.model, prompt_ids(0), new_cache(tiny.model))
        with count_fed_tokens(tiny.model) as inner:
            forward(tiny.model, prompt_ids(1), new_cache(tiny.model))
        forward(tiny.model, prompt_ids(2), new_cache(tiny.model))
    assert inner.tokens == prompt_ids(1).shape[1]
    assert outer.tokens == prompt_ids(0).shape[1] + prompt_ids(2).shape[1]
    assert clock_of(object()) is IDLE and clock_of(7) is IDLE


def test_device_map_spans_synchronise_at_both_ends(tiny, monkeypatch):
    """A model over several GPUs: every span synchronises before its start and its end (perf_counter between)."""
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synced.append(1))
    clock = ForwardClock(tiny.model)
    clock.mode = "synced"
    with clock.forward(3):
        pass
    with clock.head(torch.zeros(1)):  # no output marked: no span
        pass
    assert len(synced) == 2 and clock.forwards == 1 and clock.tokens == 3
    assert clock.finish() > 0


class _Event:
    """A CUDA event stand-in: elapsed_time in milliseconds from recorded counters."""
    made: list = []

    def __init__(self, enable_timing=False):
        self.at, self.waited = None, 0
        _Event.made.append(self)

    def record(self, stream=None):
        self.at = len(_Event.made) * 10.0

    def synchronize(self):
        self.waited += 1

    def elapsed_time(self, end):
        return end.at - self.at


class _NoHostTime:
    def perf_counter(self):
        pytest.fail("an events clock reads no host time")


def test_one_gpu_spans_are_event_pairs_read_once_at_the_end(tiny, monkeypatch):
    """One GPU: a span records an event pair on the current stream and reads nothing; finish() waits on the last
    end event and folds every pair's time in."""
    _Event.made = []
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(forward_clock, "time", _NoHostTime())  # the clock module's own `time` only
    clock = ForwardClock(tiny.model)
    clock.mode, clock.device = "events", torch.device("cuda:0")
    for _ in range(3):
        with clock.forward(2):
            pass
    assert len(clock.pairs) == 3 and clock.seconds == 0.0 and not any(e.waited for e in _Event.made)
    total = sum(end.at - start.at for start, end in clock.pairs) / 1e3
    assert clock.finish() == pytest.approx(total) and total > 0
    assert clock.pairs == [] and _Event.made[-1].waited >= 1


def test_no_hook_measures_a_model_in_core():
    """Measurement is explicit: nothing under specbench/core registers, strips or replays a module's forward hooks."""
    core = Path(__file__).resolve().parents[1] / "specbench" / "core"
    words = ("register_forward_hook", "register_forward_pre_hook", "_forward_hooks", "_forward_pre_hooks")
    found = [f"{p.relative_to(core)}: {w}" for p in core.rglob("*.py") for w in words if w in p.read_text()]
    assert found == []

"""Seconds and tokens of a target model's forwards during one generation (a step's time split into target forward,
drafting and host overhead), counted by the code that calls the model: no hook sits on any module.

`measuring(model)` makes a ForwardClock the model's clock for a block (a side table keyed by the model object);
`clock_of(model)` gives it to the callers, or an idle clock that counts nothing. The callers:
- every batch engine (core/batch/single.py, ragged.py, padded.py, static.py, static_batch.py) and the shared causal
  forward (core/batch/forward.forward) open one span (`clock.forward(tokens)`) around their decoder call and their
  LM head on the rows they keep, counting the tokens the decoder was fed (rows x width: padding included); under
  --compile the span is opened around the compiled call, outside the graph;
- an engine asked for hidden states marks what it returns as the decoder's output (`clock.output`), and
  core/batch/decoder.target_logits, through which every method reads the target's logits, times the head as the
  target's forward when it is applied to that output or a view of it (a tree's rows, the last row). A head call on
  anything else is not the target's forward: a drafter that shares the target's head (an sd layer-skip drafter,
  EAGLE) is drafting, and rows gathered into a copy first (PPD's guess rows when computed apart) count as host time,
  unless the step gathers its own verify rows through decoder.target_logits_at, which times the head on the output
  it gathers from (lookahead's root, trie and last window level).
  The output is held until the next span replaces it, so that no other tensor can take its memory and pass for it.

Timing: perf_counter on a CPU. On one GPU, a CUDA event pair per span recorded on the device's current stream, with
no synchronisation per forward; the pairs are read once when the generation ends (`finish`). A model spread over
several devices (a device map) synchronises at each span's two ends and reads perf_counter: an event pair cannot
span two GPUs.
"""

from __future__ import annotations

import time
import weakref
from contextlib import contextmanager, nullcontext

import torch


def _storage(t: torch.Tensor | None) -> int | None:
    try:
        return t.untyped_storage().data_ptr() if t is not None else None
    except RuntimeError:  # a tensor without storage (meta, some subclasses)
        return None


class ForwardClock:
    """Sums the time spent in a model's forwards, the forwards and the tokens fed, until finish()."""

    def __init__(self, model):
        devices = {p.device.type if p.device.type != "cuda" else str(p.device) for p in model.parameters()}
        cuda = {d for d in devices if d.startswith("cuda")}
        self.mode = "cpu" if not cuda else ("events" if devices == cuda and len(cuda) == 1 else "synced")
        self.device = torch.device(next(iter(cuda))) if self.mode == "events" else None  # the events' GPU
        self.seconds = 0.0  # cpu / synced spans so far
        self.pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []  # events mode, read at finish
        self.forwards = 0  # spans timed: decoder calls
        self.tokens = 0  # tokens fed to the decoder in them (rows x width)
        self._open = None  # the open span's start mark, None between spans
        self._decoder_out: torch.Tensor | None = None  # see the module docstring

    # ------------------------------------------------------------------ marks
    def _start(self) -> None:
        if self.mode == "events":
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            self._open = event
            return
        if self.mode == "synced":
            torch.cuda.synchronize()  # every GPU of this process: the span's start covers none of the earlier work
        self._open = time.perf_counter()

    def _stop(self) -> None:
        start, self._open = self._open, None
        if self.mode == "events":
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(self.device))
            self.pairs.append((start, end))
            return
        if self.mode == "synced":
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - start

    # ------------------------------------------------------------------ spans
    @contextmanager
    def forward(self, tokens: int):
        """One call of the decoder fed `tokens` (rows x width), and the LM head on its kept rows: one span. A span
        opened inside an open one is part of it (counted once)."""
        if self._open is not None:
            yield
            return
        self._decoder_out = None
        self._start()
        try:
            yield
        finally:
            self._stop()
            self.forwards += 1
            self.tokens += tokens

    def output(self, h: torch.Tensor) -> None:
        """h: the decoder's hidden states the last span returned (a later head call on it is the target's)."""
        self._decoder_out = h

    def head(self, x: torch.Tensor):
        """A context timing the LM head on x when x is the decoder's own output (or a view of it), else nothing."""
        if self._open is None and self._decoder_out is not None:
            at = _storage(x)
            if at is not None and at == _storage(self._decoder_out):
                return self._head_span()
        return nullcontext()

    @contextmanager
    def _head_span(self):
        self._start()
        try:
            yield
        finally:
            self._stop()

    def finish(self) -> float:
        """Total seconds in the forwards so far: the CUDA event pairs read (one synchronisation) and folded in."""
        self._decoder_out = None
        if self.pairs:
            self.pairs[-1][1].synchronize()  # the last end event done: every earlier one on that stream is too
            for start, end in self.pairs:
                end.synchronize()  # (another stream's: waits only if it is still running)
                self.seconds += start.elapsed_time(end) / 1e3
            self.pairs.clear()
        return self.seconds


class _Idle:
    """The clock of a model nobody measures: every span is empty."""

    def forward(self, tokens: int):
        return nullcontext()

    def output(self, h: torch.Tensor) -> None:
        pass

    def head(self, x: torch.Tensor):
        return nullcontext()


IDLE = _Idle()
_CLOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its clock while a block measures it


def clock_of(model) -> ForwardClock | _Idle:
    """The clock measuring `model` now, or IDLE."""
    try:
        return _CLOCKS.get(model, IDLE)
    except TypeError:  # an object that takes no weak reference is never measured
        return IDLE


@contextmanager
def measuring(model):
    """A ForwardClock for `model`'s forwards during the block (yielded; read it, or finish(), after the block)."""
    clock, before = ForwardClock(model), _CLOCKS.get(model)
    _CLOCKS[model] = clock
    try:
        yield clock
    finally:
        if before is None:
            _CLOCKS.pop(model, None)
        else:
            _CLOCKS[model] = before

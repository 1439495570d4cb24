"""Seconds inside a target model's forwards during one generation (a step's time split into target
forward, drafting and host overhead; core/batch/forward.count_fed_tokens attaches it).

What counts as the target's forward: the decoder stack (core/batch/decoder.decoder_module: embeddings, every
layer, the final norm), and the LM head (model.get_output_embeddings()) when it is applied to the decoder's own last
output or a view of it (the causal LM's forward, `target_logits(model, h)` on the rows the engine kept). A head call on anything
else is not the target's forward: a drafter that shares the target's head (an sd layer-skip drafter, eagle) is
drafting, and rows gathered into a copy first (PPD's guess rows when computed apart) count as host time. That the
input is the decoder's output is read from its storage (a view shares it; the output is held until the next decoder
call, so that no other tensor can take its memory and pass for it).

Timing: perf_counter in the hooks on a CPU. On one GPU, a CUDA event pair per span recorded on the device's current
stream, with no synchronisation per forward; the pairs are read once when the generation ends (`finish`). A model
spread over several devices (a device map) synchronises at each span's two ends and reads perf_counter: an event
pair cannot span two GPUs.
"""

from __future__ import annotations

import time

import torch

from ..batch.decoder import decoder_module


def _first_tensor(args, kwargs) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def _output_tensor(output) -> torch.Tensor | None:
    """The hidden states a decoder returned: last_hidden_state of a ModelOutput, else the first element."""
    found = getattr(output, "last_hidden_state", None)
    if found is None and isinstance(output, (tuple, list)) and output:
        found = output[0]
    return found if isinstance(found, torch.Tensor) else (output if isinstance(output, torch.Tensor) else None)


def _storage(t: torch.Tensor | None) -> int | None:
    try:
        return t.untyped_storage().data_ptr() if t is not None else None
    except RuntimeError:  # a tensor without storage (meta, some subclasses)
        return None


class ForwardClock:
    """Sums the time spent in a model's forwards between attach() and finish()."""

    def __init__(self, model):
        self.model = model
        devices = {p.device.type if p.device.type != "cuda" else str(p.device) for p in model.parameters()}
        cuda = {d for d in devices if d.startswith("cuda")}
        self.mode = "cpu" if not cuda else ("events" if devices == cuda and len(cuda) == 1 else "synced")
        self.seconds = 0.0  # cpu / synced spans so far
        self.pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []  # events mode, read at finish
        self.forwards = 0  # decoder calls timed
        self._open: dict[str, object] = {}  # span name -> its start mark
        # the decoder's last output, held so that its memory cannot be reused by another tensor (a drafter's states
        # at the same address would pass for it) until the next decoder call replaces it or finish() drops it
        self._decoder_out: torch.Tensor | None = None

    # ------------------------------------------------------------------ marks
    def _start(self, name: str, t: torch.Tensor | None) -> None:
        if self.mode == "events":
            device = t.device if t is not None and t.is_cuda else next(self.model.parameters()).device
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(device))
            self._open[name] = (event, device)
            return
        if self.mode == "synced":
            torch.cuda.synchronize()  # every GPU of this process: the span's start covers none of the earlier work
        self._open[name] = time.perf_counter()

    def _stop(self, name: str) -> None:
        start = self._open.pop(name, None)
        if start is None:
            return
        if self.mode == "events":
            event, device = start
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(device))
            self.pairs.append((event, end))
            return
        if self.mode == "synced":
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - start

    # ------------------------------------------------------------------ hooks
    def _decoder_pre(self, _module, args, kwargs):
        self._start("decoder", _first_tensor(args, kwargs))

    def _decoder_post(self, _module, _args, _kwargs, output):
        self._stop("decoder")
        self.forwards += 1
        self._decoder_out = _output_tensor(output)

    def _head_pre(self, _module, args, kwargs):
        x = _first_tensor(args, kwargs)
        if self._decoder_out is not None and x is not None and _storage(x) == _storage(self._decoder_out):
            self._start("head", x)

    def _head_post(self, _module, _args, _kwargs, _output):
        self._stop("head")

    def attach(self) -> list:
        """Hooks on the decoder and the LM head; returns their handles (remove them when done)."""
        decoder = decoder_module(self.model)
        head = getattr(self.model, "get_output_embeddings", lambda: None)()
        handles = []
        if isinstance(decoder, torch.nn.Module):
            handles.append(decoder.register_forward_pre_hook(self._decoder_pre, with_kwargs=True))
            handles.append(decoder.register_forward_hook(self._decoder_post, with_kwargs=True, always_call=True))
        if isinstance(head, torch.nn.Module):
            handles.append(head.register_forward_pre_hook(self._head_pre, with_kwargs=True))
            handles.append(head.register_forward_hook(self._head_post, with_kwargs=True, always_call=True))
        return handles

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

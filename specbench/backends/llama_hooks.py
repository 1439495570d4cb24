"""Counting what llama-cpp-python does, through its own hooks (imported only once llama_cpp is importable).

llama.cpp reports no tau. Its generation loop (Llama.generate) does every target evaluation through Llama.eval and
asks its draft model (Llama.draft_model, a LlamaDraftModel) for proposals before each evaluation, feeding
[last token, draft_1 .. draft_k] in one eval and sampling position by position until a sample differs from the
draft. So:
  - MeteredLlama (a Llama whose eval is wrapped) records every evaluation's tokens and its time: one entry per
    target evaluation, prefill included; an entry's tokens after the first are the drafts it verified;
  - MeteredDraft (a LlamaDraftModel wrapping llama.cpp's LlamaPromptLookupDecoding or our GreedyDraft) times the
    proposals;
  - GreedyDraft is the draft-model interface for sd: a second Llama proposing k tokens greedily (its own
    Llama.generate, which reuses the draft's KV cache for the longest prefix it shares with the last call).
A turn's accepted drafts are then the leading tokens of each verification's output that equal its drafts
(tally()).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaDraftModel


@dataclass
class Meter:
    """One turn's evaluations (the tokens fed each time, prefill first) and the seconds inside them."""

    fed: list[list[int]] = field(default_factory=list)
    forward_s: float = 0.0
    draft_calls: int = 0
    draft_s: float = 0.0

    def clear(self) -> None:
        self.fed.clear()
        self.forward_s = self.draft_s = 0.0
        self.draft_calls = 0


@contextmanager
def extra_buffers(on: bool):
    """Within: models load with llama.cpp's extra weight buffer types (AMX, repacked layouts: its
    llama_model_params.use_extra_bufts, the CLI's --no-repack when off) on or off. Llama takes no argument for it,
    so its default-parameter factory is wrapped while a model loads."""
    import llama_cpp.llama_cpp as lib

    factory = lib.llama_model_default_params

    def params():
        p = factory()
        p.use_extra_bufts = on
        return p

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = factory


class MeteredLlama(Llama):
    """A Llama that records each eval (llama.cpp's one entry point to its forward passes) in self.meter;
    extra_bufts: llama.cpp's extra weight buffer types (extra_buffers())."""

    def __init__(self, *args, extra_bufts: bool = True, **kwargs):
        self.meter = Meter()
        with extra_buffers(extra_bufts):
            super().__init__(*args, **kwargs)

    def eval(self, tokens):
        start = time.perf_counter()
        super().eval(tokens)
        self.meter.forward_s += time.perf_counter() - start
        self.meter.fed.append(list(tokens))


class GreedyDraft(LlamaDraftModel):
    """sd's draft model: `llm` (a second GGUF with the target's vocabulary) proposes `k` tokens greedily, stopping
    early at an end-of-generation token."""

    def __init__(self, llm: MeteredLlama, k: int):
        self.llm, self.k = llm, k

    def __call__(self, input_ids, /, **kwargs):
        out: list[int] = []
        stream = self.llm.generate(input_ids.tolist(), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
        for tok in stream:
            out.append(int(tok))
            if len(out) >= self.k or self.llm.is_eog(tok):
                break
        stream.close()
        return np.asarray(out, dtype=np.intc)


class MeteredDraft(LlamaDraftModel):
    """Times the proposals of llama.cpp's draft model `inner` and counts its calls in `meter` (the target's)."""

    def __init__(self, inner: LlamaDraftModel, meter: Meter):
        self.inner, self.meter = inner, meter

    def __call__(self, input_ids, /, **kwargs):
        start = time.perf_counter()
        out = self.inner(input_ids, **kwargs)
        self.meter.draft_s += time.perf_counter() - start
        self.meter.draft_calls += 1
        return out


def _is_eog(self: Llama, token: int) -> bool:
    """End of generation (EOS, EOT, <|im_end|>, ...): what llama.cpp's own completion stops on."""
    import llama_cpp

    return bool(llama_cpp.llama_vocab_is_eog(self._model.vocab, int(token)))


MeteredLlama.is_eog = _is_eog


@dataclass
class Tally:
    """What a turn's evaluations and emitted tokens say: forwards, drafted and accepted, per draft position."""

    forwards: int
    drafted: int
    accepted: int
    drafted_per_position: list[int]
    accepted_per_position: list[int]


def tally(fed: list[list[int]], emitted: list[tuple[int, int]]) -> Tally:
    """fed: the tokens of each evaluation (fed[0] the prompt; fed[f][1:] the drafts verified by evaluation f);
    emitted: (token, index of the evaluation after which it was sampled) per emitted token. A verification's
    accepted drafts: the leading emitted tokens equal to its drafts (llama.cpp stops sampling a verification at
    its first differing token)."""
    by_forward: dict[int, list[int]] = {}
    for tok, f in emitted:
        by_forward.setdefault(f, []).append(tok)
    drafted_pos: list[int] = []
    accepted_pos: list[int] = []
    drafted = accepted = 0
    for f, tokens in enumerate(fed[1:], start=1):
        drafts = tokens[1:]
        out = by_forward.get(f, [])
        kept = 0
        while kept < len(drafts) and kept < len(out) and out[kept] == drafts[kept]:
            kept += 1
        drafted += len(drafts)
        accepted += kept
        for counts, n in ((drafted_pos, len(drafts)), (accepted_pos, kept)):
            counts.extend([0] * (n - len(counts)))
            for i in range(n):
                counts[i] += 1
    accepted_pos.extend([0] * (len(drafted_pos) - len(accepted_pos)))
    return Tally(len(fed), drafted, accepted, drafted_pos, accepted_pos)

"""`pld`: prompt lookup decoding (Saxena 2023): copy the tokens that followed the latest earlier occurrence of
the last n-gram, verify them in one target forward. Training-free; lossless (greedy prefix match, or speculative
sampling against a one-hot draft, which preserves the target distribution)."""

from __future__ import annotations

import torch

from ..core.batch.cache import drop_last, new_cache
from ..core.batch.forward import forward
from ..core.verify import accept, next_token
from .base import DecodeMethod, Generation, register
from .batch_loop import Batchable
from .options import Option

NGRAM = Option("pld_ngram", int, 3, "longest n-gram looked up (tries n, n-1, ..., 1)", minimum=1)
DRAFT_TOKENS = Option("pld_draft_tokens", int, 10, "tokens copied after a match", minimum=1)


def lookup_draft(history: list[int], max_ngram: int, max_tokens: int) -> list[int]:
    """Tokens following the most recent earlier match of the longest suffix n-gram (n = max_ngram .. 1)."""
    size = len(history)
    for n in range(min(max_ngram, size - 1), 0, -1):
        suffix = history[size - n:]
        # scan right to left for the latest earlier occurrence (not the suffix itself)
        for start in range(size - n - 1, -1, -1):
            if history[start:start + n] == suffix:
                follow = history[start + n:start + n + max_tokens]
                if follow:
                    return follow
    return []


@register
class PromptLookup(Batchable, DecodeMethod):
    name = "pld"
    kind = "draft-free"
    summary = "prompt lookup: n-gram copy from prompt and output, verified in one forward"
    option_specs = (NGRAM, DRAFT_TOKENS)

    @torch.inference_mode()
    def generate(self, input_ids, max_new_tokens, sampling, generator):
        model, stop_ids = self.target.model, self.target.tokenizer.stop_ids
        device = input_ids.device
        gen = Generation()
        cache = new_cache(model)
        history = input_ids[0].tolist()
        logits = forward(model, input_ids, cache, logits_to_keep=1)[-1]  # prefill: [V]
        tok = next_token(logits, sampling, generator)
        done = gen.emit([tok], stop_ids, max_new_tokens)
        history.append(tok)
        while not done:
            room = max_new_tokens - len(gen.tokens) - 1  # the forward always yields one more token
            draft = lookup_draft(history, self.options.pld_ngram, min(self.options.pld_draft_tokens, room))
            # 1. verify: the last emitted token plus the draft in one forward -> logits [k+1, V]
            step = torch.tensor([[history[-1]] + draft], device=device)
            logits = forward(model, step, cache)
            # 2. accept (one-hot draft distribution: q = None)
            draft_t = torch.tensor(draft, dtype=torch.long, device=device)
            n, tok = accept(draft_t, logits, sampling, None, generator)
            if draft:
                gen.count_draft(len(draft), n)
            new = draft[:n] + [tok]
            # 3. update the cache: keep the last token and accepted drafts, drop rejected positions
            drop_last(cache, len(draft) - n)
            done = gen.emit(new, stop_ids, max_new_tokens)
            history.extend(new)
        return gen

    def propose(self, samples, max_new_tokens, sampling):
        """Batch > 1: each sample's own lookup (one-hot draft: q = None)."""
        for s in samples:
            s.draft = lookup_draft(s.history, self.options.pld_ngram,
                                   min(self.options.pld_draft_tokens, s.room(max_new_tokens)))
            s.q = None

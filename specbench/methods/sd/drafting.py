"""Model + KV cache bookkeeping shared by the draft-model methods (`sd`, `pearl`), and the autoregressive draft loop
(Leviathan et al. 2023, Alg. 1 lines 1-4; PEARL Alg. 2 lines 5-8 and 24-28).

A ModelState remembers which tokens its cache holds, so rolling back after a rejection is one call: keep the
longest prefix the cache shares with the new sequence (cache.crop_to), feed the rest on the next forward.
"""

from __future__ import annotations

import torch

from ...core.batch.cache import crop_to, new_cache
from ...core.batch.forward import forward
from ...core.verify import Sampling, sample, warp_probs
from .drafter import check_vocabulary, default_drafter
from ..base import DecodeMethod
from ..options import Option

GAMMA = Option("gamma", int, None, "draft length (default: chosen from measured forward times)", minimum=1)


class ModelState:
    """A model, its KV cache, and the token ids whose keys/values the cache holds."""

    def __init__(self, model: torch.nn.Module, device: torch.device, vocab: int):
        self.model, self.device, self.vocab = model, device, vocab
        self.cache = new_cache(model)
        self.fed: list[int] = []
        self.forwards = 0  # forward passes so far (a drafter's: Generation.draft_forwards; catch-up feeds count)
        self._trusted = 0  # positions known to agree with every later sequence (verified tokens)

    def rollback(self, seq: list[int], verified: int | None = None) -> None:
        """Keep the cache's longest common prefix with seq, leaving at least seq's last token to be fed."""
        n = kept_prefix(self.fed, seq, self._trusted)
        if n < len(self.fed):
            crop_to(self.cache, n)
            del self.fed[n:]
        if verified is not None:
            self._trusted = min(n, verified)

    def pending(self, seq: list[int]) -> list[int]:
        """The tokens of seq the cache does not hold yet (call rollback(seq) first)."""
        return seq[len(self.fed):]

    def feed(self, tokens: list[int], keep: int) -> torch.Tensor:
        """Append tokens to the cache; returns the logits of the last `keep` positions [keep, V_target]."""
        ids = torch.tensor([tokens], device=self.device)  # [1, n]
        logits = forward(self.model, ids, self.cache, logits_to_keep=keep)  # [keep, V_model]
        self.forwards += 1
        self.fed.extend(tokens)
        return fit_vocab(logits, self.vocab)


def kept_prefix(fed: list[int], seq: list[int], start: int = 0) -> int:
    """How many of the cached tokens `fed` a cache keeps for the sequence `seq`: their longest common prefix
    (positions before `start` are known to agree), leaving at least seq's last token to be fed again."""
    n, limit = start, min(len(fed), len(seq) - 1)
    while n < limit and fed[n] == seq[n]:
        n += 1
    return n


def draw(logits: torch.Tensor, sampling: Sampling,
         generator: torch.Generator | None) -> tuple[int, torch.Tensor | None]:
    """One draft token from drafter logits [V]: (argmax, None) when greedy, else (a sample, the warped q [V] it
    was drawn from: speculative sampling needs it)."""
    if sampling.greedy:
        return int(logits.argmax()), None
    q = warp_probs(logits, sampling)  # [V]
    return sample(q, generator), q


def greedy_draws(logits: list[torch.Tensor], vocab: int) -> list[int]:
    """Each row's argmax of drafter logits (n rows of [V]) as one argmax over the stacked rows [n, vocab] and one copy
    to Python: a batch's greedy drafts, not one argmax and one copy a row (~0.1 ms each on a CPU, 8 a step at B = 8)."""
    return fit_vocab(torch.stack(logits), vocab).argmax(-1).tolist()


def fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Logits [n, V_model] -> [n, vocab]: a drafter's padded head is cut, a smaller one padded with -inf."""
    size = logits.shape[-1]
    if size == vocab:
        return logits
    if size > vocab:
        return logits[..., :vocab]
    pad = logits.new_full((*logits.shape[:-1], vocab - size), float("-inf"))
    return torch.cat([logits, pad], -1)


def draft_tokens(state: ModelState, seq: list[int], k: int, sampling: Sampling,
                 generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
    """k tokens continuing seq, one drafter forward each; returns (tokens, q [k, V] or None when greedy).

    q are the warped draft probabilities the tokens were sampled from (speculative sampling needs them).
    """
    state.rollback(seq)
    feed = state.pending(seq)
    tokens: list[int] = []
    probs: list[torch.Tensor] = []
    for _ in range(k):
        tok, q = draw(state.feed(feed, keep=1)[-1], sampling, generator)
        if q is not None:
            probs.append(q)
        tokens.append(tok)
        feed = [tok]
    return tokens, (torch.stack(probs) if probs else None)


class DraftModelMethod(DecodeMethod):
    """Base of methods that need a drafter: the shipped one by default, a foreign vocabulary refused."""

    kind = "draft-model"
    needs = ("target", "drafter")
    option_specs = (GAMMA,)

    def __init__(self, target, options=None, drafter=None):
        super().__init__(target, options, drafter)
        check_vocabulary(target, self.drafter)
        self.vocab = target.vocab_size

    @classmethod
    def default_drafter(cls, target):
        return default_drafter(target)


def child_generator(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """An independent generator for the drafter's samples, seeded from the caller's (reproducible with threads)."""
    if generator is None:
        return None
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    return torch.Generator(device=device).manual_seed(seed)

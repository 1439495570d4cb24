"""SuffixDecoding's two indexes (Oliaro et al. 2024, §3.1): one per request over its prompt and what it has
generated so far, and one global index over the outputs of the requests that finished before it in this run.
A draft comes from whichever index proposes the higher-scoring tree (the per-request one on a tie), as
ArcticInference's SuffixDecodingCache.speculate chooses.

A request is keyed by its prompt's token ids: the global index never offers a request the output of the same prompt
(a --repeats timing, a re-timed turn), which would be its own answer; a run's warm-up outputs are dropped before
its timed turns (SuffixDecoding.warmed_up). A request is `warm` when the global index held another prompt's output
as it started, `cold` otherwise (the run's first prompt, every prompt with --suffix-global off)."""

from __future__ import annotations

from dataclasses import dataclass

from .index import Draft, SuffixIndex


@dataclass
class Request:
    """One request's own index and key (the prompt's token ids)."""

    key: tuple[int, ...]
    local: SuffixIndex
    warm: bool


class SuffixCache:
    """The global index of finished outputs (one sequence per distinct prompt, the latest kept) and the counts of
    cold and warm starts."""

    def __init__(self, max_depth: int, use_global: bool = True):
        self.max_depth = max_depth
        self.use_global = use_global
        self.outputs = SuffixIndex(max_depth)
        self.ids: dict[tuple[int, ...], int] = {}  # prompt -> its output's sequence id in `outputs`
        self.starts = {"cold": 0, "warm": 0}
        # the context's own end, a place of every pattern in the request's index, is counted in the global
        # index's scores too (ArcticInference's global tree holds the running response): a match is scored alike
        # in either index, and the per-request one wins a tie
        self.own_end = 1

    def start(self, prompt: list[int]) -> Request:
        key = tuple(prompt)
        own = self.ids.get(key)
        warm = self.use_global and self.outputs.live(frozenset() if own is None else frozenset({own})) > 0
        self.starts["warm" if warm else "cold"] += 1
        local = SuffixIndex(self.max_depth)
        local.extend(0, prompt)
        return Request(key, local, warm)

    def speculate(self, request: Request, context: list[int], max_tokens: int, alpha: float, min_prob: float,
                  deepest: int | None = None, offset: float = 0.0) -> Draft:
        """The per-request index's tree or the global one's, whichever scores higher (the request's on a tie)."""
        mine = request.local.speculate(context, max_tokens, alpha, min_prob, deepest=deepest, offset=offset)
        if not self.use_global:
            return mine
        own = self.ids.get(request.key)
        theirs = self.outputs.speculate(context, max_tokens, alpha, min_prob,
                                        frozenset() if own is None else frozenset({own}), deepest, offset,
                                        unseen=self.own_end)
        return mine if mine.score >= theirs.score else theirs

    def finish(self, request: Request, output: list[int]) -> None:
        """The request's output joins the global index, replacing an earlier output of the same prompt."""
        if not self.use_global or not output:
            return
        old = self.ids.get(request.key)
        if old is not None:
            self.outputs.retire(old)
        self.ids[request.key] = len(self.outputs.seqs)  # every sequence ever added keeps its entry: a new id
        self.outputs.extend(self.ids[request.key], output)

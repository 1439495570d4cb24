"""`suffix`: SuffixDecoding (Oliaro et al. 2024, "SuffixDecoding: Extreme Speculative Decoding for Emerging AI
Applications"): a suffix index over the prompt and the output so far, and a global one over the outputs of the
run's earlier prompts (cache.py), propose a speculation tree chosen by frequency scores with a length adaptive to
the match (index.py); the target verifies the tree in one forward with a tree mask (core/tree.py) and accepts the
longest verified path (core/verify.py). Training-free, no drafter; lossless: exact match at T = 0, multi-candidate
speculative sampling over the (distinct, deterministic) siblings at T > 0.

The tree's width is sized to the hardware (width.py): with a latency profile of this machine each step keeps the
first nodes of the best-first tree that give the most expected tokens per unit of the verify forward's time.

Each step, per sample: 0. a newcomer's prompt is prefilled (and indexed); 1. draft its tree from the indexes;
2. one target forward over every newcomer's prompt and every active sample's root (its last token) and tree;
3. accept the longest verified path, per sample on its own random stream; 4. keep the root and that path in the
cache, index the emitted tokens. A finished sample's output joins the global index. Counters: `drafted` counts the
tree's depth per step (the longest run that could be accepted), as the tree methods count it; `draft_s` the time
spent choosing the trees."""

from __future__ import annotations

import torch
from rich.markup import escape

from ...core.batch.ragged import Segment
from ...core.machine.timing import now
from ...core.tree import Tree
from ...core.verify import next_token, tree_speculative_accept
from ...progress import console
from ..base import DecodeMethod, register
from ..batch_loop import Batchable
from ..options import Option
from . import width
from .cache import SuffixCache

MAX_DEPTH = Option("suffix_max_depth", int, 64, "the suffix trees' depth: longest pattern plus continuation indexed "
                   "(ArcticInference's default)", minimum=2)
ALPHA = Option("suffix_alpha", float, 1.0, "a tree holds at most alpha x the match length + --suffix-offset tokens "
               "(the paper's MAX_SPEC = alpha p; ArcticInference's max_spec_factor default)", minimum=0.0)
OFFSET = Option("suffix_offset", float, 4.0, "tokens a tree may hold beyond alpha x the match length, so that a short "
                "match still drafts a few (ArcticInference's max_spec_offset; 0: the paper's MAX_SPEC = alpha p)",
                minimum=0.0)
MIN_PROB = Option("suffix_min_prob", float, 0.1, "a node's score (the empirical probability of reaching it) must be "
                  "at least this (ArcticInference's min_token_prob default)", minimum=0.0)
MAX_SPEC = Option("suffix_max_spec", int, 16, "most tokens one tree holds (the verify forward's width less one)",
                  minimum=1)
WIDTH = Option("suffix_width", str, "latency", "latency: each tree cut where its expected tokens per unit of the "
               "verify forward's time peak on this hardware's latency profile (no profile: as scored); scored: the "
               "tree as scored, up to --suffix-max-spec", choices=("latency", "scored"))
GLOBAL = Option("suffix_global", str, "on", "the global index over earlier prompts' outputs (off: each prompt's "
                "own index only, every prompt cold)", choices=("on", "off"))


@register
class SuffixDecoding(Batchable, DecodeMethod):
    name = "suffix"
    kind = "draft-free"
    summary = "suffix decoding: suffix trees over the prompt, output and earlier outputs draft a tree, verified at once"
    option_specs = (MAX_DEPTH, ALPHA, OFFSET, MIN_PROB, MAX_SPEC, WIDTH, GLOBAL)
    said_when_loaded = ("suffix_width_from",)

    def __init__(self, target, options=None, drafter=None):
        super().__init__(target, options, drafter)
        self.cache = SuffixCache(self.options.suffix_max_depth, self.options.suffix_global == "on")
        self.widths = {1: width.sized(target, self.options.suffix_width, self.max_verify_width)}
        self.costs = self.widths[1][0]
        console.print(f"[dim]{self.name}: tree width {escape(self.widths[1][1])}[/]")

    @property
    def max_verify_width(self) -> int:
        """The widest verify forward (a tree of up to --suffix-max-spec tokens and its root): --compile's buckets."""
        return self.options.suffix_max_spec + 1

    def chosen(self) -> dict:
        """run.yaml's and report.md's label of the caches (the first prompt a run decodes is cold) and of the width."""
        out = {"suffix_width_from": self.widths[1][1]}
        if len(self.widths) > 1:
            out["suffix_width_per_batch_size"] = {b: why for b, (_, why) in sorted(self.widths.items())}
        if not self.cache.use_global:
            return {**out, "caches": "each prompt's own index only (--suffix-global off): every prompt cold"}
        return {**out, "caches": "each prompt's own index, and a global index of the outputs of the prompts decoded "
                                 "before it in this process, every dataset and batch size of the run (never the same "
                                 "prompt's own output): cold for the first prompts the run decodes (its first prompt "
                                 "at batch 1, or its first batch when it starts batched), warm after; batch sizes > 1 "
                                 "run after batch 1 and read its outputs"}

    def choose_per_batch_size(self, sizes: list[int]) -> None:
        """Each batch size's costs from this hardware's L(B, w) (every input costs B rows), else batch 1's."""
        for size in sorted({b for b in sizes if b > 1} - set(self.widths)):
            self.widths[size] = width.sized_batch(self.target, self.options.suffix_width, self.max_verify_width, size,
                                                  self.widths[1])
            console.print(f"[dim]{self.name}: batch size {size}: tree width {escape(self.widths[size][1])}[/]")

    def start_batch(self, mode: str, slots: int) -> None:
        self.costs = self.widths.get(slots, self.widths[1])[0]

    def warmed_up(self) -> None:
        """The warm-up's outputs leave the global index (the run's first timed prompt is cold)."""
        self.cache = SuffixCache(self.options.suffix_max_depth, self.options.suffix_global == "on")

    def leave(self, sample) -> None:
        request = sample.scratch.pop("suffix", None)
        if request is not None:
            self.cache.finish(request, sample.gen.tokens)

    def _draft(self, sample, max_new_tokens: int) -> tuple[Tree, list[int]]:
        """1. draft: the sample's tree and its tokens, root first [N]; the time it took is drafting time."""
        start = now()
        o = self.options
        # no deeper than the tokens still wanted (the verify always adds one more)
        draft = self.cache.speculate(sample.scratch["suffix"], sample.history, o.suffix_max_spec, o.suffix_alpha,
                                     o.suffix_min_prob, deepest=max(sample.room(max_new_tokens), 0),
                                     offset=o.suffix_offset)
        if self.costs is not None:
            draft = draft.cut(self.costs)
        tree = Tree(tuple(draft.paths()))
        sample.gen.draft_s += now() - start
        return tree, [sample.history[-1]] + draft.tokens

    def decode_step(self, target, joining, active, max_new_tokens, sampling):
        """Newcomers' prefill and every active sample's tree (root and candidates, its tree mask and positions) in
        one forward of the batch engine."""
        stop_ids = self.target.tokenizer.stop_ids
        for s in joining:  # 0. a newcomer's own index over its prompt
            s.scratch["suffix"] = self.cache.start(s.history)
        steps = []
        for s in active:
            tree, tokens = self._draft(s, max_new_tokens)
            past = target.lengths[s.slot]
            s.scratch.update(tree=tree, tokens=tokens, past=past)
            steps.append(Segment(s.slot, tokens, positions=(tree.offsets() + past).tolist(),
                                 mask=tree.visible() if tree.paths else None))
        # 2. verify: newcomers' prompts and every active sample's tree, in one batched forward
        first, logits = target.forward([Segment(s.slot, s.history, keep=1) for s in joining], steps)
        finished = []
        for s, lg in zip(joining, first):
            token = next_token(lg[-1], sampling, s.generator)
            s.history.append(token)
            s.scratch["suffix"].local.extend(0, [token])
            if s.gen.emit([token], stop_ids, max_new_tokens):
                finished.append(s)
        for s, lg in zip(active, logits):  # lg: [N, V], the target's logits after each node's path
            tree, tokens, past = s.scratch["tree"], s.scratch["tokens"], s.scratch["past"]
            # 3. accept: the longest verified path and the target's next token, on this sample's random stream
            ids = torch.tensor(tokens, device=lg.device)  # [N]
            if self.acceptance_rule is not None and tree.paths:  # --synthetic-acceptance: a stated draw over ranks
                path, token = self.acceptance_rule.tree(ids, tree.parents, tree.paths, lg, sampling, s.generator,
                                                        gen=s.gen)
            else:
                path, token = tree_speculative_accept(ids, tree.parents, lg, sampling, s.generator)
            emitted = [tokens[i] for i in path[1:]] + [token]
            if tree.paths:
                s.gen.count_draft(tree.depth, len(path) - 1)
                # 4. update cache: keep the root and the accepted path
                target.keep_offsets(s.slot, past, path)
            s.history += emitted
            s.scratch["suffix"].local.extend(0, emitted)
            if s.gen.emit(emitted, stop_ids, max_new_tokens):
                finished.append(s)
        return finished

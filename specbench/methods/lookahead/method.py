"""`lookahead`: lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding", ICML): Jacobi iterations over a 2D window make n-grams, the n-grams that start with the last token are
verified, both in one target forward (window.py lays it out). Training-free, lossless: greedy verification at T = 0,
and at T > 0 the paper's sampling rule for several candidates (accept candidate x with probability p(x), else set
p(x) = 0 and renormalise before the next; core/verify.tree_speculative_accept over the candidates' trie).

Each step, at every batch size (the batch engines pack, pad or, at batch 1, append the inputs): 0. newcomers'
prefill (their first token; their window starts from the prompt); 1. draft: the pool's n-grams for the last token as
a trie, beside the window's levels; 2. verify: one forward with the window's and the trie's visibility and positions;
3. accept the longest verified path and the target's next token, per sample on its own random stream; 4. keep only
the root and that path in the cache; the last level's argmax becomes the next level, its n-grams enter the pool.
"""

from __future__ import annotations

import torch
from rich.markup import escape

from ...core.batch.decoder import target_logits, target_logits_at
from ...core.batch.ragged import Segment
from ...core.verify import next_token, tree_speculative_accept
from ...planning.batch_choice import batch_view, local_profile, relative_latency
from ...progress import console
from ..base import DecodeMethod, register
from ..batch_loop import Batchable
from ..options import Option
from . import shapes as measured_shapes
from . import sizing
from .window import Shape, Window, layout, rank_paths, trie

WINDOW = Option("lookahead_window", int, None, "Jacobi window W, the columns guessed ahead (default: sized with N "
                "and G to this hardware's latency profile, else the paper's 15)", minimum=1)
NGRAM = Option("lookahead_ngram", int, None, "n-gram size N (the window keeps N - 1 levels; each verified n-gram "
               "is N - 1 tokens after the last one; default: sized with W and G, else the paper's 5)", minimum=2)
GUESSES = Option("lookahead_guesses", int, None, "G, the most n-grams verified a step (default: sized with W and "
                 "N, else the paper's 15)", minimum=1)
SHAPE = Option("lookahead_shape", str, "sized", "sized: W, N and G not given are chosen for the highest predicted "
               "speedup, tokens per step over the forward's cost on this hardware's latency profile; paper: the "
               "paper's W = 15, N = 5, G = 15", choices=("sized", "paper"))


@register
class Lookahead(Batchable, DecodeMethod):
    name = "lookahead"
    kind = "draft-free"
    summary = "lookahead decoding: Jacobi window makes n-grams, those starting with the last token verified at once"
    option_specs = (WINDOW, NGRAM, GUESSES, SHAPE)
    said_when_loaded = ("lookahead_window", "lookahead_ngram", "lookahead_guesses", "lookahead_sized_from")

    def __init__(self, target, options=None, drafter=None, quiet: bool = False):
        super().__init__(target, options, drafter)
        self.fed_inputs = self.decode_steps = 0  # inputs of the decode steps' forwards, and those steps, per sample
        profile = local_profile(target, use_for="lookahead's shape") if self._sized() else None
        # measured tokens per step of a grid of shapes (`estimate --method lookahead`), read where they can be priced
        self.rows, self.rows_from = measured_shapes.filed(target) if profile is not None else (None, "")
        self.shapes = {1: self._shape(profile)}  # batch size -> (Shape, where W, N and G came from)
        self.shape = self.shapes[1][0]
        if not quiet:
            console.print(f"[dim]{self.name}: W {self.shape.window}, N {self.shape.ngram}, G {self.shape.guesses} "
                          f"(widest forward {self.shape.width}; {escape(self.shapes[1][1])})[/]")

    def _sized(self) -> bool:
        o = self.options
        given = (o.lookahead_window, o.lookahead_ngram, o.lookahead_guesses)
        return o.lookahead_shape == "sized" and None in given

    def _shape(self, profile, curve: str = "L(w)") -> tuple[Shape, str]:
        o = self.options
        given = (o.lookahead_window, o.lookahead_ngram, o.lookahead_guesses)
        if o.lookahead_shape == "paper":
            best, source = sizing.paper(*given)
        else:
            costs = relative_latency(profile, sizing.widest(*given)) if profile is not None else None
            best, source = sizing.choose(costs, *given, rows=self.rows, rows_from=self.rows_from, curve=curve)
        return Shape(best.window, best.ngram, best.guesses), source

    def chosen(self) -> dict:
        shape, source = self.shapes[1]
        out = {"lookahead_window": shape.window, "lookahead_ngram": shape.ngram, "lookahead_guesses": shape.guesses,
               "lookahead_sized_from": source}
        if len(self.shapes) > 1:
            out["lookahead_per_batch_size"] = {b: {"window": s.window, "ngram": s.ngram, "guesses": s.guesses,
                                                   "from": why} for b, (s, why) in sorted(self.shapes.items())}
        return out

    def choose_per_batch_size(self, sizes: list[int]) -> None:
        """Each batch size's W, N and G from this hardware's L(B, w) (every input costs B rows), else batch 1's."""
        if not self._sized():
            return
        for size in sorted({b for b in sizes if b > 1} - set(self.shapes)):
            view, why = batch_view(self.target, size)
            self.shapes[size] = (self._shape(view, f"L(B={size}, w)") if view is not None
                                 else (self.shapes[1][0], f"batch 1's: {why}"))
            s = self.shapes[size][0]
            console.print(f"[dim]{self.name}: batch size {size}: W {s.window}, N {s.ngram}, G {s.guesses} "
                          f"({escape(self.shapes[size][1])})[/]")

    def estimate_more(self, prompts: list[torch.Tensor], new_tokens: int) -> dict:
        """`specbench estimate --method lookahead`: tokens per step of every shape of the grid (shapes.py), and the
        shape the acceptance per position beside them was counted with (this method's own, as sized here)."""
        shape = self.shapes[1][0]
        return {"per_position_shape": {"window": shape.window, "ngram": shape.ngram, "guesses": shape.guesses},
                "shapes": measured_shapes.measure(type(self), self.target, prompts, new_tokens)}

    def start_batch(self, mode: str, slots: int) -> None:
        self.shape = self.shapes.get(slots, self.shapes[1])[0]

    def decode_step(self, target, joining, active, max_new_tokens, sampling):
        """Newcomers' prefill and every active sample's window and candidates in one forward of the batch engine."""
        model, stop_ids, shape = self.target.model, self.target.tokenizer.stop_ids, self.shape
        # 0. prefill: the prompt, its last position's logits give the first token
        joined = [Segment(s.slot, s.history, keep=1) for s in joining]
        # 1. draft: the pool's n-grams that start with the last token (cut to the room left), as a trie
        segments, drafts = [], []
        for s in active:
            window: Window = s.scratch["window"]
            root = s.history[-1]
            tokens, parents, depths = trie(window.pool.get(root), min(shape.ngram - 1, s.room(max_new_tokens)))
            ids, offsets, visible = layout(window.shape, root, window.levels, tokens, parents, depths)
            past = target.lengths[s.slot]
            segments.append(Segment(s.slot, ids, positions=[past + o for o in offsets], mask=visible))
            self.fed_inputs, self.decode_steps = self.fed_inputs + len(ids), self.decode_steps + 1
            drafts.append((root, tokens, parents, depths, past))
        # 2. verify: one forward over every newcomer's prompt and every active sample's window and trie
        first, hidden = target.forward(joined, segments, hidden=True)
        finished = []
        for s, h in zip(joining, first):
            tok = next_token(target_logits(model, h[-1]), sampling, s.generator)
            s.history.append(tok)
            s.scratch["window"] = Window(shape, s.history)
            if s.gen.emit([tok], stop_ids, max_new_tokens):
                finished.append(s)
        for s, h, (root, tokens, parents, depths, past) in zip(active, hidden, drafts):
            window = s.scratch["window"]
            b, k = window.shape.branch, len(tokens)
            # the head on the rows the step reads: root, every trie node, then the window's last level [1 + K + W, V]
            # (the trie's first: its rows are a view), timed as the target's forward
            logits = target_logits_at(model, h, [0, *range(b, b + k), *window.shape.last_level])
            nodes = logits[: 1 + k]  # root, then every trie node [1 + K, V]
            # 3. accept: the longest verified path of the trie, then the target's next token
            if self.acceptance_rule is not None and tokens:  # --synthetic-acceptance: a stated draw over the trie
                path, nxt = self.acceptance_rule.tree(torch.tensor([root, *tokens]), [-1, *parents],
                                                      rank_paths(parents), nodes, sampling, s.generator, gen=s.gen)
            else:
                path, nxt = tree_speculative_accept(torch.tensor([root, *tokens]), [-1, *parents], nodes, sampling,
                                                    s.generator)
            accepted = [tokens[node - 1] for node in path[1:]]
            if tokens:
                s.gen.count_draft(max(depths), len(accepted))  # the trie's depth: the longest run a step could accept
            # 4. update: the cache keeps the root and the path; the window moves on (its last level's argmax)
            target.keep_offsets(s.slot, past, [0] + [b + node - 1 for node in path[1:]])
            window.advance(root, logits[1 + k:].argmax(-1).tolist())
            emitted = accepted + [nxt]
            s.history += emitted
            if s.gen.emit(emitted, stop_ids, max_new_tokens):
                finished.append(s)
        return finished


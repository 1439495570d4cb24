"""Lookahead decoding's tokens per step for a grid of shapes (W, N, G), measured on validation prompts by `specbench
estimate --method lookahead` and filed in its acceptance file (`shapes`), which sizing.py reads at run time.

Each shape decodes every prompt greedily (tokens per step and the forward's inputs do not depend on the machine);
a row per shape: window, ngram, guesses, tokens_per_step (new tokens after the prefill's / decode steps) and
mean_width (the inputs of a decode step's forward: the window's W (N - 1) and the trie's nodes)."""

from __future__ import annotations

import torch

from ...core import lookup, store
from ...core.model.load import model_slug
from ...core.verify import Sampling
from ...planning.acceptance import read_fields
from ...planning.shape_pricing import check_rows

GRID = tuple((side, n, side) for n in (3, 4, 5) for side in (1, 2, 4, 8, 15))  # (W, N, G), W = G as the paper's


def measure(method_class, target, prompts: list[torch.Tensor], new_tokens: int,
            grid: tuple[tuple[int, int, int], ...] | None = None) -> list[dict]:
    """A row per shape of `grid` (None: GRID): its tokens per decode step and mean forward width on `prompts`
    ([1, T] each)."""
    rows = []
    for window, ngram, guesses in grid or GRID:
        method = method_class(target, {"lookahead_window": window, "lookahead_ngram": ngram,
                                       "lookahead_guesses": guesses}, quiet=True)
        tokens = steps = 0
        for ids in prompts:
            gen = method.generate(ids, new_tokens, Sampling(), None)
            tokens += max(len(gen.tokens) - 1, 0)  # the prefill's token is not a decode step's
            steps += max(gen.target_forwards - 1, 0)
        rows.append({"window": window, "ngram": ngram, "guesses": guesses,
                     "tokens_per_step": round(tokens / steps, 5) if steps else 1.0,
                     "mean_width": round(method.fed_inputs / method.decode_steps, 3) if method.decode_steps else 1.0})
    return rows


def filed(target) -> tuple[list[dict] | None, str]:
    """(the `shapes` rows of this model's lookahead acceptance file, where they came from), or (None, "")."""
    relative = store.acceptance_file(model_slug(target.spec), "lookahead")
    found = lookup.find(lookup.ACCEPTANCE, relative)
    if found is None:
        return None, ""
    rows = read_fields(found.path).get("shapes")
    if not rows:
        return None, ""
    check_rows(rows, str(found.path))
    lookup.use(found, "lookahead's shape")
    return rows, found.said()

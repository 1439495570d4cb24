"""The tree step's verify-and-accept (method.decode_step, at every batch size): from
the target's hidden states over one tree to the emitted tokens, the compacted cache and the next guess state."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...core.batch.forward import target_logits
from ...core.machine.timing import now
from ..base import Generation
from .layout import TreeLayout


def verify_and_accept(method, state, tokens: torch.Tensor, q: torch.Tensor | None, h: torch.Tensor,
                      layout: TreeLayout, keep: Callable[[list[int]], None], sampling, generator,
                      gen: Generation) -> tuple[list[int], object]:
    """tokens [N] (root first), q [N, V] or None, h [q, H] -> (emitted tokens: the accepted path then the target's
    own next token, the next state). `keep(path)` compacts this sample's cache to the root and the path."""
    model = method.target.model
    tree = layout.tree
    # 2. verify: the target's logits at every node (one head call over every input while the extra rows are few;
    # target_logits: the model's own final processing too, e.g. Gemma 2's soft-capping, else lossy at T > 0)
    all_logits = target_logits(model, h) if layout.combined_head else None  # [q, V]
    logits = all_logits[: tree.nodes] if layout.combined_head else target_logits(model, h[: tree.nodes])  # [N, V]
    # 3. accept: the longest verified path, then the target's own next token
    if method.acceptance_rule is not None:  # --synthetic-acceptance: a stated draw over the tree's ranks
        path, root = method.acceptance_rule.tree(tokens, layout.parents, tree.paths, logits, sampling, generator,
                                                 gen=gen)
    else:
        path, root = method.guesser.accept(tokens, layout.parents, logits, q, sampling, generator)
    accepted = tokens[path[1:]].tolist()
    gen.count_draft(tree.depth, len(accepted))
    # 4. update cache: keep the root and the accepted path; the next guesses come from the last accepted node
    keep(path)
    emitted = accepted + [root]
    if not method.guesser.advance_drafts:
        return emitted, method.guesser.advance(state, h, layout, path, emitted, all_logits)
    start = now(method.target.device)  # the next guesses come from a model of the guesser's (Medusa's heads and the
    nxt = method.guesser.advance(state, h, layout, path, emitted, all_logits)  # LM head on them): drafting time
    gen.draft_s += now(method.target.device) - start  # (host overhead otherwise: records' host_s)
    return emitted, nxt

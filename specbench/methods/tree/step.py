"""The tree step's verify-and-accept (method.decode_step, at every batch size): from the target's hidden states over
one proposed tree to the emitted tokens, the compacted cache and the sample's next state."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...core.batch.forward import target_logits
from ...core.machine.timing import now
from ..base import Generation
from .accept_rule import AcceptRule
from .proposer import Drafted, Proposer


def verify_and_accept(model, proposer: Proposer, rule: AcceptRule, state, drafted: Drafted, h: torch.Tensor,
                      keep: Callable[[list[int]], None], sampling, generator, gen: Generation) -> tuple[list[int], object]:
    """drafted (tokens [N] root first, q [N, V] or None, its layout), h [q, H] the target's hidden states over it ->
    (emitted tokens: the accepted path then the target's own next token, the next state). `rule` accepts (the
    method's acceptance rule); `keep(path)` compacts this sample's cache to the root and the path."""
    layout, tokens = drafted.layout, drafted.tokens
    tree = layout.tree
    # 2. verify: the target's logits at every node (one head call over every input while the extra rows are few;
    # target_logits: the model's own final processing too, e.g. Gemma 2's soft-capping, else lossy at T > 0)
    all_logits = target_logits(model, h) if layout.combined_head else None  # [q, V]
    logits = all_logits[: tree.nodes] if layout.combined_head else target_logits(model, h[: tree.nodes])  # [N, V]
    # 3. accept: the longest verified path, then the target's own next token
    path, root = rule(tokens, tree, logits, drafted.q, sampling, generator, gen)
    accepted = tokens[path[1:]].tolist()
    gen.count_draft(tree.depth, len(accepted))
    # 4. update cache: keep the root and the accepted path; the next guesses come from the last accepted node
    keep(path)
    emitted = accepted + [root]
    if not proposer.advance_drafts:
        return emitted, proposer.advance(state, h, layout, path, emitted, all_logits)
    device = h.device
    start = now(device)  # the next guesses come from a model of the proposer's (Medusa's heads and the LM head on
    nxt = proposer.advance(state, h, layout, path, emitted, all_logits)  # them): drafting time
    gen.draft_s += now(device) - start  # (host overhead otherwise: records' host_s)
    return emitted, nxt

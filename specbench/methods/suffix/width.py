"""Suffix decoding's tree width sized to the hardware: the verify forward's cost per width, relative to a one-token
forward, read from this machine's latency profile as the tree methods read it (planning/batch_choice.py).

A tree's node scores estimate the chance that each node is accepted (index.py), so a step that verifies its first n
nodes emits 1 + their scores tokens on average and costs L(n + 1) / L(1) of a plain decoding step; `Draft.cut`
keeps the n with the most tokens per unit of that cost. On a GPU the curve is flat to tens of inputs and the whole
scored tree is kept; on a CPU a wide tree costs more than its unlikely nodes are worth and is cut."""

from __future__ import annotations

from ...core import lookup
from ...planning.batch_choice import batch_view, local_profile, relative_latency

Costs = list[float] | None  # [L(w) / L(1) for w = 1 .. the widest verify forward], None: no cut


def sized(target, mode: str, most: int) -> tuple[Costs, str]:
    """(costs, where they came from) at batch 1: `mode` "scored" keeps the trees as scored; "latency" reads this
    hardware's profile of the target, or keeps the trees as scored without one (said, with the command that
    measures it)."""
    if mode == "scored":
        return None, "as scored (--suffix-width scored)"
    profile = local_profile(target, use_for="suffix's tree width")
    if profile is None:
        return None, ("as scored: no latency profile of this hardware (`specbench profile` measures one; each tree "
                      "is then cut where its expected tokens per unit of forward time peak)")
    padded = lookup.compiled_run()  # --compile: a tree of any width runs at its power-of-two bucket (compile.py)
    return relative_latency(profile, most, padded), (f"each tree cut where expected tokens per unit of L(w) peak "
                                                     f"(profile {profile.hardware}, w <= {most}"
                                                     f"{', each width at its bucket' if padded else ''})")


def sized_batch(target, mode: str, most: int, size: int, single: tuple[Costs, str]) -> tuple[Costs, str]:
    """Batch size `size`'s costs from L(B, w) where the profile has it, else batch 1's (said why)."""
    if mode == "scored" or single[0] is None:
        return single
    view, why = batch_view(target, size)
    if view is None:
        return single[0], f"batch 1's: {why}"
    return relative_latency(view, most, lookup.compiled_run()), \
        f"each tree cut where expected tokens per unit of L(B={size}, w) peak"

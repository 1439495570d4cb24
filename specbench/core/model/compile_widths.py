"""The query widths a method declares to `--compile` before it decodes (core/model/compile.py turns them into
buckets and sizes the static cache from the widest): the longest chain it verifies, every state of the trees it
lays out at a batch size, and the widest tree it drafts afresh each step."""

from __future__ import annotations


def declared_tree_widths(method, slots: int = 1) -> set[int]:
    """The verify widths of every tree state a tree method lays out at batch size `slots` (that size's tree, else
    batch 1's, as the step picks it: root, prompt inputs and candidates of each state); empty for a chain method
    or one off the static engine."""
    trees = getattr(method, "trees", None) or {}
    tree = trees.get(slots, trees.get(1))
    if tree is None or tree.dynamic is not None or not getattr(method, "static_engine", True):  # dynamic: per step
        return set()
    return {int(layout.visible.shape[0]) for layout in tree.layouts.values()}


def declared_varying_width(method) -> int:
    """The widest tree a method drafts afresh each step (its `max_verify_width`: suffix decoding's), 0 for none."""
    if not getattr(method, "static_engine", True):
        return 0
    return int(getattr(method, "max_verify_width", 0) or 0)


def declared_width(method) -> int:
    """The longest chain a method verifies in one forward (its drafts + the last emitted token), where it says so:
    pld's draft tokens, sd's gamma; 1 otherwise (a tree method's width joins the buckets when warm-up meets it), and 1
    for a method that never decodes on the static engine (`static_engine = False`: PEARL's own caches)."""
    if not getattr(method, "static_engine", True):
        return 1
    options = getattr(method, "options", None)
    draft = getattr(options, "pld_draft_tokens", None) or getattr(method, "gamma", None) or 0
    return int(draft) + 1

"""A method family's declaration: what planning, training, the store and the CLI need to know about it, torch-free.

A family is the unit a method belongs to (ppd, medusa, eagle, ..., and the chain methods ar, pld, sd, pearl): the
name that keys its files (acceptance/<model>/<name>.yaml, trees/<model>/<prefix><hardware>-<dtype>.yaml,
artifacts/<model>/<name>/), the module whose import registers its decoding methods, and, for tree families, the
shape of its trees, how its drafting cost grows with depth and what its drafter weighs. Callables here take plain
numbers or duck-typed shapes (planning/latency_estimate.ModelShape) so the declaration imports nothing heavy; code
that needs torch is named by import strings ("module:attribute"), loaded only when used (`load`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

KINDS = ("baseline", "draft-free", "draft-model", "tree")
DRAFT_COSTS = ("", "step", "depth")  # nothing beyond the target's forward | one drafting forward a step | per depth


@dataclass(frozen=True)
class Artefact:
    """What `specbench train` writes into the family's artefact folder: its metadata file and its weights file."""

    meta: str
    weights: str


@dataclass(frozen=True)
class Family:
    """One family's declaration (module docstring). Tree-only fields keep their defaults for chain families."""

    name: str  # the file-name key and the `--method` of estimate / build-tree / plan
    kind: str  # baseline | draft-free | draft-model | tree (the kind of its registered methods)
    methods: str  # the module whose import registers the family's decoding methods (@register)
    # trees/<model>/<tree_prefix><hardware>-<dtype>.yaml; None: "<name>-" (the one family without a prefix is the
    # family whose trees came first, build-tree's default)
    tree_prefix: str | None = None
    one_state: bool = False  # a static candidate tree of one state, not a dynamic sparse tree of prompt-token states
    dynamic_trees: bool = False  # can draft its tree each step (EAGLE-2's dynamic tree: `--tree dynamic`)
    draft_cost: str = ""  # DRAFT_COSTS: how its drafting's milliseconds grow with the tree's depth (cost_law)
    mask_inputs: bool = False  # its feature drafter reads trained [MASK] inputs (k of them, one forward drafts k + 1)
    artefact: Artefact | None = None  # what `specbench train` writes
    aliases: tuple[str, ...] = ()  # other names its artefacts' metadata may carry (early-exit heads are medusa's)
    train_config: str = ""  # import string of its `specbench train` config class (torch-free: train/configs.py)
    scorer: str = ""  # import string of scorer(target, artifact, initial) -> GuessScorer for `specbench estimate`
    has_initial: bool = False  # `estimate --initial` scores the artefact's untrained start
    # `plan` (planning/plan.py), from the model's shape and the acceptance file's fields:
    drafter_read: Callable | None = None  # (shape, fields) -> weights one drafting forward reads (LM head included)
    drafter_weights: Callable | None = None  # (shape, fields) -> the drafter's or heads' own weights
    drafter_kv_layers: int = 0  # decoder layers of its own whose KV cache grows with the context
    # `specbench train`'s memory check (core/model/memory_need.train_workload):
    # (cfg, hidden, one decoder layer's weights, tokens a sequence, sequences) -> (trained parameters, bytes cached)
    train_memory: Callable | None = None
    backprop_target: bool = False  # its loss back-propagates through the frozen target (activations kept)
    # a step of a shape (W, N, G), not a chain: `plan` and `recommend` price it from the measured shapes in its
    # acceptance file (planning/chain_plan.plan_shape), not from its acceptance per position
    shaped: bool = False

    def __post_init__(self):
        if self.kind not in KINDS or self.draft_cost not in DRAFT_COSTS:
            raise ValueError(f"family {self.name}: kind {self.kind!r} / draft_cost {self.draft_cost!r} unknown")

    @property
    def tree(self) -> bool:
        return self.kind == "tree"

    @property
    def drafts_with_model(self) -> bool:
        """Its drafting costs more than the target's forward (a drafter or heads run apart from it)."""
        return bool(self.draft_cost)

    @property
    def prefix(self) -> str:
        return f"{self.name}-" if self.tree_prefix is None else self.tree_prefix

    def tree_stem(self, stem: str) -> str:
        """A tree file's stem for this family: `<hardware>-<dtype>` -> `<prefix><hardware>-<dtype>`."""
        return self.prefix + stem

    def cost_law(self, ms: float) -> Callable[[int], float]:
        """depth -> drafting milliseconds per step from one drafting forward's `ms`."""
        if self.draft_cost == "depth":
            return lambda depth: ms * max(depth, 1)
        return lambda depth: ms


def load(target: str):
    """"package.module:attribute[.attribute]" -> the object (imports the module only now)."""
    module, _, attribute = target.partition(":")
    found = importlib.import_module(module)
    for part in attribute.split(".") if attribute else ():
        found = getattr(found, part)
    return found

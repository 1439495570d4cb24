"""Tree methods: one engine (engine.py: the decoding loop, batch 1 and batch > 1; step.py: verify and accept;
layout.py; resolution.py: which tree) and one guesser per method, each file registering its methods.

Adding a tree method: one guesser file (a Guesser subclass and a @register'd TreeMethod naming it) and one line
below. The import order is the registry's order (`specbench list methods`).
"""

# the registry's order (`specbench list methods`): ppd, medusa, eagle and parallelspec, hidden-transfer
# isort: off
from . import prompt_tokens, medusa_heads, feature_drafter, transfer  # noqa: F401  (registers the methods)
# isort: on
from .feature_drafter import EAGLE_DEPTH  # noqa: F401
from .feature_drafting import (  # noqa: F401
    DrafterState,
    draft_tree_eagle,
    draft_tree_parallel,
    eagle_plan,
)
from .layout import TreeLayout  # noqa: F401
from .resolution import candidate_tree, chain, searched_tree  # noqa: F401
from .transfer import transfer_slots  # noqa: F401

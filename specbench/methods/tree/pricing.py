"""The planning side of a tree family, apart from its decode-time proposer: what `specbench estimate` scores
(GuessScorer) and what the family's drafting costs per step (DraftPricing: the predicted speedups a run and
`recommend` print, and the trees a run builds with `--tree auto`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ... import families
from ...core.machine.hardware import hardware_slug
from ...core.tree import Tree
from ...core.model.load import dtype_name
from ...planning.acceptance import draft_cost


@dataclass(frozen=True)
class GuessScorer:
    """What `specbench estimate` scores for one method: ranks(ids, start) -> [positions, rows], the rank of the true
    token among the top-10 guesses per token distance (planning/head_accuracy's layout); rows: distances
    scored; source: the artefact, for the console and the file; extra: fields the acceptance file adds."""

    ranks: Callable
    rows: int
    source: str
    extra: dict = field(default_factory=dict)


class DraftPricing:
    """A method's drafting cost per step, as a run pays it: the step's own drafting of a tree (the pending rows, the
    tree's widths, its top-k, gathers and host copies; the proposer's `time_drafting`) timed on the target's
    device and dtype, once per tree; or, for another machine's profile, the acceptance file's time moved there.

    The price is per drafting forward as its family's declared cost law takes it (eagle pays it once per depth,
    the others once a step; the proposer divides eagle's timed drafting of a tree by its depth). A bare forward of
    the drafter (what `estimate` times) costs less than what the step pays (pending rows, widths, top-k, gathers:
    benchmarks/draft_pricing.py measures the factor)."""

    def __init__(self, time_drafting: Callable[[Tree | None], float | None], target=None, family: str = ""):
        self.time_drafting = time_drafting  # the method times one step's drafting (None: nothing drafts)
        self.target, self.family = target, family
        self._timed: dict[tuple | None, float | None] = {}  # tree paths (None: the method's) -> ms, once taken

    def ms_here(self, tree: Tree | None = None) -> float | None:
        """Milliseconds per drafting forward here (the cost law's unit), measured once per tree by drafting `tree`
        as the step does (None: the tree the method prices by default, before any tree is chosen). The acceptance
        file's time, moved from the machine `estimate` ran on by the target's forward there and here, misses how
        the drafter's share changes between machines; the two can differ many times over
        (benchmarks/RESULTS-gpu.md). None where the guesses ride in the target's forward."""
        key = tree.paths if tree is not None else None
        if key not in self._timed:
            from ...core.model.tensor_parallel import from_writer

            with torch.inference_mode():  # --tp: each rank times it (collectives), rank 0's time builds every tree
                ms = from_writer(self.time_drafting(tree))
                ms = None if ms is None else ms * from_writer(self.clock())
            self._timed[key] = None if ms is None else round(ms, 4)
        return self._timed[key]

    def clock(self, context: int = 256, repeats: int = 5) -> float:
        """This hardware's profile L(1) over the target's 1-token forward timed now on a `context`-long cache (1
        without a profile): the drafting is timed now but priced beside the profile's L(n), so a machine busier or
        threaded otherwise than when it was profiled keeps the drafting's share of the target's forward (on a
        quiet machine this is about 1)."""
        from ...planning.batch_choice import local_profile

        profile = local_profile(self.target, compiled=False) if self.target is not None else None  # eager, as timed
        if profile is None:
            return 1.0
        from ...core.batch.cache import new_cache
        from ...core.batch.forward import forward, timed_forward

        model, device = self.target.model, self.target.device
        cache = new_cache(model)
        vocab = model.get_input_embeddings().weight.shape[0]
        forward(model, torch.randint(vocab, (1, context), device=device), cache)
        one = torch.tensor([[vocab // 2]], device=device)
        times = sorted(timed_forward(model, one, cache, device) for _ in range(repeats + 1))[:repeats]
        return profile.latency_ms(1, context) / times[len(times) // 2]

    def profiles_here(self, profile) -> bool:
        """`profile` is of the machine and dtype this method decodes on."""
        return (profile.hardware, profile.dtype) == (hardware_slug(self.target.device), dtype_name(self.target.dtype))

    def cost(self, acceptance_file, profile=None, tree: Tree | None = None):
        """depth -> drafting milliseconds per step, for predicted speedups (None when the family's guesses ride in
        the target's forward): `tree`'s drafting timed here when `profile` is this machine's in the run's dtype,
        else the method's acceptance file's time moved to `profile`'s machine."""
        if profile is not None and self.profiles_here(profile) and (ms := self.ms_here(tree)) is not None:
            return families.get(self.family).cost_law(ms)
        return draft_cost(self.family, acceptance_file, profile)

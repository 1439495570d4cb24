"""The planning side of a tree family, apart from its decode-time guesser: what `specbench estimate` scores
(GuessScorer) and what the family's drafting costs per step (DraftPricing: the predicted speedups a run and
`recommend` print, and the trees a run builds with `--tree auto`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ...core.machine.hardware import hardware_slug
from ...core.model.load import dtype_name
from ...planning.acceptance import cost_law, draft_cost


@dataclass(frozen=True)
class GuessScorer:
    """What `specbench estimate` scores for one method: ranks(ids, start) -> [positions, rows], the rank of the true
    token among the top-10 guesses per token distance (planning/acceptance.score_sequence's layout); rows: distances
    scored; source: the artefact, for the console and the file; extra: fields the acceptance file adds."""

    ranks: Callable
    rows: int
    source: str
    extra: dict = field(default_factory=dict)


class DraftPricing:
    """A method's drafting cost per step: one drafting forward (the drafter, or medusa's heads) timed on the target's
    device and dtype, once; or, for another machine's profile, the acceptance file's time moved there."""

    def __init__(self, time_drafting: Callable[[], float | None], target=None, family: str = ""):
        self.time_drafting = time_drafting  # the family's guesser times one drafting forward (None: nothing drafts)
        self.target, self.family = target, family
        self._timed: list[float | None] = []  # ms_here's one measurement, once taken

    def ms_here(self) -> float | None:
        """Milliseconds of one drafting forward here, measured once: the acceptance file's time, moved from the
        machine `estimate` ran on by the target's forward there and here, misses how the drafter's share changes
        between machines; the two can differ many times over (benchmarks/RESULTS-gpu.md). None where the guesses
        ride in the target's forward."""
        if not self._timed:
            from ...core.model.tensor_parallel import from_writer

            with torch.inference_mode():  # --tp: each rank times it (collectives), rank 0's time builds every tree
                self._timed.append(from_writer(self.time_drafting()))
        return self._timed[0]

    def profiles_here(self, profile) -> bool:
        """`profile` is of the machine and dtype this method decodes on."""
        return (profile.hardware, profile.dtype) == (hardware_slug(self.target.device), dtype_name(self.target.dtype))

    def cost(self, acceptance_file, profile=None):
        """depth -> drafting milliseconds per step, for predicted speedups (None when the family's guesses ride in
        the target's forward): timed here when `profile` is this machine's in the run's dtype, else the method's
        acceptance file's time moved to `profile`'s machine."""
        if profile is not None and self.profiles_here(profile) and (ms := self.ms_here()) is not None:
            return cost_law(self.family, ms)
        return draft_cost(self.family, acceptance_file, profile)

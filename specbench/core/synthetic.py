"""Synthetic acceptance (`specbench run --synthetic-acceptance`): an acceptance rule that decides which verified drafts
are kept by a seeded draw from a stated acceptance profile (core/acceptance_profile.py) instead of comparing them with
the target's logits. Every method still drafts and verifies for real (its tree, drafter, heads and host work), so a
step costs what it costs; only the number of drafts kept is stated. vLLM's and llama.cpp's synthetic rejection
samplers do the same for their engines.

What is emitted: the accepted drafts are kept as if the target had accepted them, then the target's own next token
at the last accepted node (its argmax at temperature 0, a sample of it otherwise) follows, as in a real step. So the
sequence is the drafts' and the target's mixed: not the model's output (no lossless check applies), but every step
after the first is a real step of the method on a real (if unusual) context.

The draw: at depth d the true token is the rank-r guess with probability per_rank[d-1][r] (ranks exclusive), and none
of them otherwise. A chain keeps its drafts while the draw is rank 0; a tree descends into the child of the drawn rank
while there is one. Each step adds the draw's expected value and variance to the sample's Generation
(`synthetic_mean`, `synthetic_var`), so a run can check its measured acceptance against the stated one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import SpecbenchError
from .acceptance_profile import AcceptanceProfile, read
from .verify import Sampling, next_token, uniform


@dataclass(frozen=True)
class PerMethodAcceptance:
    """`--synthetic-acceptance FOLDER`: each method's own stated acceptance, the folder's <family>.yaml or
    <family>.json (acceptance/published/<model>/ holds one per family: each method beside its own paper)."""

    folder: str
    profiles: dict  # file stem (a method family, or a method's name) -> AcceptanceProfile

    @property
    def source(self) -> str:
        return f"{self.folder} (each method its own file)"

    def of(self, key: str) -> AcceptanceProfile:
        if key not in self.profiles:
            raise SpecbenchError(f"--synthetic-acceptance {self.folder}: no {key}.yaml or {key}.json in it (it has "
                                 f"{', '.join(sorted(self.profiles)) or 'no acceptance file'})")
        return self.profiles[key]


def read_stated(spec: str) -> AcceptanceProfile | PerMethodAcceptance:
    """--synthetic-acceptance's value: rates, one acceptance file, or a folder of one file per method family."""
    folder = Path(spec)
    if not folder.is_dir():
        return read(spec)
    files = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
    if not files:
        raise SpecbenchError(f"--synthetic-acceptance {spec}: a folder with no acceptance file (<method>.yaml or "
                             "<method>.json, as acceptance/published/<model>/ holds them)")
    return PerMethodAcceptance(str(folder), {p.stem: read(str(p)) for p in files})


def stated_for(stated, key: str) -> AcceptanceProfile:
    """The stated acceptance of the method whose file key (its family, else its name) is `key`."""
    return stated.of(key) if isinstance(stated, PerMethodAcceptance) else stated


class SyntheticAcceptance:
    """The acceptance rule of a synthetic run. The draws come from the sample's own random stream (the generator the
    run seeds per prompt turn: the same draws on every repeat and at every batch size), or from the rule's seeded
    stream where a caller passes none."""

    def __init__(self, profile: AcceptanceProfile, seed: int = 0):
        self.profile = profile
        self.rng = random.Random(seed)

    def _true_rank(self, depth: int, generator) -> int | None:
        """Which rank's guess is the true token at `depth` (None: none of them)."""
        u, total = (self.rng.random() if generator is None else uniform(generator)), 0.0
        row = self.profile.per_rank[depth - 1] if depth <= len(self.profile.per_rank) else ()
        for rank, p in enumerate(row):
            total += p
            if u < total:
                return rank
        return None

    def chain(self, draft: torch.Tensor, logits: torch.Tensor, sampling: Sampling, q, generator,
              bonus: bool = True, gen=None) -> tuple[int, int | None]:
        """verify.accept's contract: draft [k], logits [k+1, V] ([k, V] without bonus) -> (accepted count, next
        token; None when all k are accepted without a bonus)."""
        k = int(draft.shape[0])
        n = 0
        while n < k and self._true_rank(n + 1, generator) == 0:
            n += 1
        if gen is not None:
            mean, var = self.profile.chain_expectation(k)
            gen.synthetic_mean += mean
            gen.synthetic_var += var
        if n == k and not bonus:
            return n, None
        return n, next_token(logits[n], sampling, generator)

    def tree(self, tokens: torch.Tensor, parents: list[int], paths, logits: torch.Tensor, sampling: Sampling,
             generator, gen=None) -> tuple[list[int], int]:
        """The verify.tree_*_accept contract: tokens [N] (root first), parents [N], paths [N - 1] (each candidate's
        ranks from the root), logits [N, V] -> (the accepted path of node indices from the root, the next token)."""
        child = {(parents[i], tuple(paths[i - 1])[-1]): i for i in range(len(parents) - 1, 0, -1)}  # first wins
        path, depth = [0], 0
        while True:
            rank = self._true_rank(depth + 1, generator)
            node = None if rank is None else child.get((path[-1], rank))
            if node is None:
                break
            path.append(node)
            depth += 1
        if gen is not None:
            mean, var = self.profile.tree_expectation([tuple(p) for p in paths])
            gen.synthetic_mean += mean
            gen.synthetic_var += var
        return path, next_token(logits[path[-1]], sampling, generator)

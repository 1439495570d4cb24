"""What every decoding method shares: the Generation result, the registry, the base class (options: options.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..core.model.load import LoadedModel
from ..core.verify import Sampling
from ..errors import SpecbenchError
from .options import Option, OptionValues


@dataclass
class Generation:
    """What one generate() call returns. Counting follows docs/measurement.md."""

    tokens: list[int] = field(default_factory=list)  # new token ids, up to and including a stop token
    target_forwards: int = 0  # target forward passes, prefill included
    accepted_lengths: list[int] = field(default_factory=list)  # tokens emitted by each target forward
    drafted: int = 0  # draft tokens proposed for verification
    draft_forwards: int = 0  # drafter forward passes (draft-model methods; prefill included)
    draft_s: float = 0.0  # wall seconds inside drafting (drafter forwards and choosing the drafts)
    accepted_drafts: int = 0  # of those, accepted
    accepted_per_position: list[int] = field(default_factory=list)  # accepted drafts by draft position
    drafted_per_position: list[int] = field(default_factory=list)  # proposed drafts by draft position
    # drafts proposed at a position whose previous draft was accepted (the denominator of the conditional rate)
    reached_per_position: list[int] = field(default_factory=list)
    stopped: bool = False  # ended on a stop token (not the length cap)
    timeline: list[dict] = field(default_factory=list)  # per-step draft/target busy spans (sd, pearl; timeline.py)
    # batch > 1 (methods/batch_loop.py): this sample's share of the target's work, and its time in the batch
    target_tokens: int = 0  # tokens fed through the target for it, prefill included, padding included
    padding_tokens: int = 0  # of those, padding (padded batching only)
    kv_padding: int = 0  # padded KV entries it held when it left (EMS-SD Appendix B's padding length, summed)
    latency_s: float = 0.0  # from joining the batch to its last token
    # EMS-SD §4.1 times incremental decoding only: the batch steps that only prefilled (no sample decoding yet)
    prefill_s: float = 0.0  # its equal share of the prefill-only steps it joined in (the shares sum to their time)
    prefill_tokens: int = 0  # tokens it emitted in such a step (its first token, when it joined in one)
    # serving view: perf_counter seconds from the turn's start at which each new token was emitted (the
    # tokens of one target forward share a time); a record's time to first token and inter-token latencies
    token_times: list[float] = field(default_factory=list)
    # that start: made when generation begins (a batched sample's, when it joins its batch: its own request's start)
    started: float = field(default_factory=time.perf_counter, repr=False, compare=False)
    # host overhead: seconds inside the target's forwards; wall - forward_s - draft_s is host overhead
    forward_s: float = 0.0
    # --compile: decode forwards (target and drafter; the prompt's prefill aside) through a compiled graph, and those
    # that ran eagerly (run/compiled.forwards); None when the run does not compile
    compiled_forwards: int | None = None
    eager_forwards: int | None = None
    # --synthetic-acceptance (core/synthetic.py): the stated acceptance's expected accepted drafts over this
    # generation's verifications, and their variance (the run checks the measured count against them)
    synthetic_mean: float = 0.0
    synthetic_var: float = 0.0

    def count_draft(self, proposed: int, accepted: int) -> None:
        """Record one verification of `proposed` draft tokens of which the first `accepted` were kept."""
        self.drafted += proposed
        self.accepted_drafts += accepted
        for counts, n in ((self.drafted_per_position, proposed), (self.accepted_per_position, accepted),
                          (self.reached_per_position, min(proposed, accepted + 1))):
            if len(counts) < proposed:
                counts.extend([0] * (proposed - len(counts)))
            for i in range(n):
                counts[i] += 1

    def emit(self, new: list[int], stop_ids: tuple[int, ...], max_new_tokens: int) -> bool:
        """Append tokens from one target forward, cut at a stop token or the cap; True when generation is done."""
        self.target_forwards += 1
        kept = 0
        at = time.perf_counter() - self.started  # the tokens are on the host here: this forward has finished
        for tok in new:
            if len(self.tokens) >= max_new_tokens:
                break
            self.tokens.append(tok)
            self.token_times.append(at)
            kept += 1
            if tok in stop_ids:
                self.stopped = True
                break
        self.accepted_lengths.append(kept)
        return self.stopped or len(self.tokens) >= max_new_tokens


class DecodeMethod:
    """A decoding method. Subclasses set the class attributes and implement generate()."""

    name: ClassVar[str]
    kind: ClassVar[str]  # baseline | draft-free | draft-model | tree
    needs: ClassVar[tuple[str, ...]] = ("target",)
    lossless: ClassVar[bool] = True
    summary: ClassVar[str] = ""
    option_specs: ClassVar[tuple[Option, ...]] = ()  # this method's own options (CLI flags, run.yaml keys)
    unset_text: ClassVar[dict[str, str]] = {}  # option name -> what leaving it out means here, where a shared
    # option's own wording (Option.unset) does not fit this method
    batchable: ClassVar[bool] = False  # decodes batch > 1 (methods/batch_loop.py's Batchable)
    unbatchable: ClassVar[str] = "not built for batch > 1"  # why not, where it cannot (run validation says it)
    # tree methods (kind "tree"): what build-tree reads from the registry (set from the method's guesser, tree/method.py)
    family: ClassVar[str | None] = None  # file-name key: acceptance/<model>/<family>.yaml, trees' `method`,
    # artifacts/<model>/<family>/ (ppd and ppd-typical share "ppd")
    one_state: ClassVar[bool] = False  # its tree has one state (a static candidate tree), not PPD's dynamic states
    # which verified drafts are kept: None = the method's own rule (the target's logits); a SyntheticAcceptance
    # (core/synthetic.py) under --synthetic-acceptance
    acceptance_rule = None

    def __init__(self, target: LoadedModel, options: Mapping[str, Any] | None = None,
                 drafter: LoadedModel | None = None):
        self.target = target
        self.options = OptionValues(self.option_specs, options, f"method {self.name}")
        self.drafter = drafter
        if "drafter" in self.needs:
            if drafter is None:
                self.drafter = self.default_drafter(target)
            if self.drafter is None:
                raise SpecbenchError(f"method {self.name} needs a drafter and {target.spec} has none: train one with "
                                     f"`specbench train drafter --model {target.spec}` (found by itself "
                                     "afterwards), or pass --drafter (a model with the same tokenizer, or a folder "
                                     "written by `specbench train drafter`)")

    @classmethod
    def default_drafter(cls, target: LoadedModel) -> LoadedModel | None:
        """The drafter used when none is given (methods that need one override this); None = refuse."""
        return None

    def chosen(self) -> dict:
        """Settings this method chose itself (defaults it measured or looked up), for run.yaml and the console."""
        return {}

    def estimate_more(self, prompts: list[torch.Tensor], new_tokens: int) -> dict:
        """`specbench estimate`: fields a method measures on the validation prompts ([1, T] each) beyond its acceptance
        per position, added to its acceptance file (lookahead: tokens per step of a grid of shapes)."""
        return {}

    def warmed_up(self) -> None:
        """The run's untimed warm-up is over: drop what it left that timed turns must not read (suffix: the warm-up's
        outputs in its global index)."""

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, sampling: Sampling,
                 generator: torch.Generator | None) -> Generation:
        """input_ids: [1, T] prompt. Returns the new tokens and counters."""
        raise NotImplementedError


REGISTRY: dict[str, type[DecodeMethod]] = {}


def register(cls: type[DecodeMethod]) -> type[DecodeMethod]:
    """Add a method under its name; a second class under a taken name is refused (it would silently replace one)."""
    taken = REGISTRY.get(cls.name)
    if taken is not None and taken is not cls:
        raise ValueError(f"method name {cls.name!r} is taken by {taken.__module__}.{taken.__qualname__}; "
                         f"{cls.__module__}.{cls.__qualname__} needs a name of its own")
    REGISTRY[cls.name] = cls
    return cls


def tree_families() -> dict[str, type[DecodeMethod]]:
    """family -> the first registered tree method of it (ppd, medusa, hidden-transfer, eagle, parallelspec): the
    methods `estimate --method` and `build-tree --method` take."""
    out: dict[str, type[DecodeMethod]] = {}
    for cls in REGISTRY.values():
        if cls.kind == "tree" and cls.family and cls.family not in out:
            out[cls.family] = cls
    return out


def get_method(name: str) -> type[DecodeMethod]:
    if name not in REGISTRY:
        raise SpecbenchError(f"unknown method {name!r}; available: {', '.join(REGISTRY)} "
                             "(see `specbench list methods`)")
    return REGISTRY[name]


"""What one `specbench run` measures: RunConfig (every option, with its default) and the default run folder."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..core.verify import Sampling
from ..methods import REGISTRY, OptionValues, get_method, split_by_method
from .shard import Shard


@dataclass(frozen=True)
class RunConfig:
    methods: tuple[str, ...] = ("ar", "pld")
    datasets: tuple[str, ...] = ("humaneval",)
    model: str = "smollm2-135m"
    drafter: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    limit: int | None = 6
    per_category: bool = False  # limit = the first N of every category
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    warmup: int = 1
    repeats: int = 1  # timed generations per prompt turn (median wall time recorded)
    retime: int = 2  # re-timings of a prompt turn whose timing was disturbed (run/retime.py); 0: only flag it
    threads: int | None = None
    data_file: str | None = None
    out: Path = Path("results/latest")
    resume: bool = False
    options: dict = field(default_factory=dict)  # method options by name (flat, as the CLI gives them)
    tree_sizes: tuple[int, ...] = ()  # tree methods run once per size, labelled <method>@<size>; 0: @auto
    batch_sizes: tuple[int, ...] = (1,)  # prompts decoded at once (EMS-SD); 1 = one at a time
    batching: str = "both"  # at batch > 1: unpadded (EMS-SD), padded (the vanilla way) or both
    refill: bool = False  # at batch > 1: a finished sample's slot takes the next prompt (continuous batching)
    shard: Shard | None = None  # --shard I/N: only this slice of the prompts (run/shard.py)
    # placement (core/model/placement.py): a device map for the target / a separate drafter, or tensor parallelism
    device_map: str | None = None
    max_memory: str | None = None
    drafter_device_map: str | None = None
    drafter_max_memory: str | None = None
    tp: int = 1
    # who decodes (the backend, run/backend.py): "specbench" (this package's loop), "llama.cpp", "openai"
    engine: str = "specbench"
    engine_options: dict = field(default_factory=dict)  # the engine's own settings (base_url, concurrency, ...)
    # --compile (core/model/compile.py): batch-1 forwards through torch.compile at static shapes
    compile: bool = False
    # profiles and trees measured on a disturbed machine: skipped unless allowed (core/lookup.py)
    allow_disturbed_profile: bool = False
    recommendation: str | None = None  # --method auto: the recommendation file it followed (run.yaml names it)
    synthetic_acceptance: str | None = None  # rates or an acceptance file: a stated draw keeps drafts (run/synthetic.py)

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.top_k, self.seed)

    def settings(self) -> dict:
        """The settings a resumed run must share (everything but out / resume)."""
        d = asdict(self)
        d.pop("out"), d.pop("resume")
        d["methods"], d["datasets"] = list(self.methods), list(self.datasets)
        d["tree_sizes"] = list(self.tree_sizes)
        d["batch_sizes"] = list(self.batch_sizes)
        d["options"] = self.method_options()
        d["shard"] = str(self.shard) if self.shard else None
        return d

    def method_options(self) -> dict[str, dict]:
        """Per method of this run: the options it declares, with their values (defaults filled in)."""
        given = split_by_method(self.options, self.methods, REGISTRY)
        return {m: dict(OptionValues(get_method(m).option_specs, given[m], f"method {m}")) for m in self.methods}


def results_root() -> Path:
    """Where run folders go by default: $SPECBENCH_RESULTS, else results/ in the working directory."""
    return Path(os.environ.get("SPECBENCH_RESULTS", "results"))


def default_out() -> Path:
    """results/<timestamp> so that plain repeated runs never collide."""
    return results_root() / time.strftime("%Y%m%d-%H%M%S")

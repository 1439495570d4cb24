"""The settings every trainer shares (TrainSettings, the base of each method's config dataclass) and the default
training mix."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ..core import store
from ..core.model.load import model_slug
from ..errors import SpecbenchError

TRAINING_MIX = "alpaca-eval,stdlib-code,word-problems,stdlib-docs,chat-tasks"  # chat, code, maths, summaries: the
# offline mix the trainers default to (no benchmark prompt: data/disjoint.py)

# fields that may change between a run and its --resume (they never change what a step computes)
RESUMABLE = ("steps", "resume", "out", "save_every")


@dataclass(frozen=True)
class TrainSettings:
    """Shared fields; each method's config subclasses it, adds its own fields and overrides defaults."""

    model: str = "smollm2-135m"
    data: str = TRAINING_MIX  # sources to self-distil, comma-separated; `prompts` from each
    steps: int = 500
    lr: float = 1e-3
    prompts: int | None = 120  # training prompts per source, after the held-out ones
    held_out: int = 100  # the first prompts of each source, left out of training
    new_tokens: int = 96  # self-distilled continuation length
    out: Path | None = None  # default artifacts/<model>/<method folder>
    dtype: str = "auto"
    device: str = "auto"
    device_map: str | None = None  # --device-map / --max-memory (core/model/placement.py): the frozen target's placement
    max_memory: str | None = None
    save_every: int = 100
    resume: bool = False
    seed: int = 0
    data_file: str | None = None

    def check_common(self) -> None:
        """Refuse shared settings no run can use (before any slow work)."""
        if self.steps < 1 or self.save_every < 1:
            raise SpecbenchError("--steps and --save-every must be at least 1")
        if not self.lr > 0:
            raise SpecbenchError(f"--lr must be positive (got {self.lr})")

    def settings(self) -> dict:
        """What a checkpoint must agree on to be resumed: every field but RESUMABLE, paths as strings."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items() if k not in RESUMABLE}

    def artifact_out(self, folder: str) -> Path:
        """--out, else artifacts/<model>/<folder> in the working directory (where decoding looks first)."""
        return self.out or store.artifact_dir(model_slug(self.model), folder)

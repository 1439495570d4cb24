"""The run's work lists, as named records: the loaded datasets, the batch-1 prompts still to run (each with its
method order) and the batch > 1 jobs still to run (each with its pending method x mode labels).

Batch 1 runs every method on a prompt in an order rotated per prompt (`interleaved`), so a burst of load cannot
land on one method only; on --resume the prompts and labels already done (resume.Done) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from ..data import datasets as ds
from ..errors import SpecbenchError
from ..progress import console
from .config import RunConfig
from .resume import Done


@dataclass(frozen=True)
class LoadedDataset:
    """One --dataset, loaded: its spec (the name records carry) and its prompts (after --limit)."""

    spec: ds.DatasetSpec
    prompts: list[ds.Prompt]

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class PromptWork:
    """One prompt at batch 1: the methods (labels) still to run on it, in this prompt's order."""

    dataset: str
    index: int  # the prompt's position in its dataset (seeds and the rotation follow it)
    prompt: ds.Prompt
    labels: list[str]


@dataclass(frozen=True)
class BatchLabel:
    """One way a batch job decodes its prompts: a method in a batching mode (unpadded or padded)."""

    method: str
    mode: str


@dataclass(frozen=True)
class IndexedPrompt:
    """A prompt of a batch job with its position in its dataset."""

    index: int
    prompt: ds.Prompt


@dataclass(frozen=True)
class BatchJob:
    """One group of prompts of one dataset decoded at one batch size by every label (batch_schedule.jobs)."""

    dataset: str
    batch_size: int
    group: int  # the job's number among its dataset's jobs at this batch size (batch ids and the rotation)
    prompts: list[IndexedPrompt]
    labels: list[BatchLabel]  # in this job's order


@dataclass(frozen=True)
class BatchWork:
    """One batch > 1 job and its labels still to run."""

    job: BatchJob
    labels: list[BatchLabel]


def interleaved(labels: list[str], index: int) -> list[str]:
    """The method order for prompt `index`: rotated by one per prompt, so each method (ar included) runs first,
    second, ... equally often and a burst of load cannot land on one of them only."""
    k = index % len(labels)
    return labels[k:] + labels[:k]


def single_labels(cfg: RunConfig, labels: list[str]) -> list[str]:
    """The labels that decode one prompt at a time: all of them when --batch-size includes 1; else only ar, the
    batch-1 reference every batched sample's tokens are checked against (greedy), or none (sampling)."""
    if 1 in cfg.batch_sizes:
        return labels
    if cfg.sampling.greedy:
        console.print("[dim]ar also runs at batch size 1: its tokens are the reference of every batched sample's "
                      "lossless check[/]")
        return ["ar"]
    return []


def pending_prompts(loaded: list[LoadedDataset], labels: list[str], done: Done) -> list[PromptWork]:
    """Batch 1's work: every prompt with the labels not done yet, in its rotated order; prompts with none left out."""
    work = [PromptWork(d.name, i, p, [m for m in interleaved(labels, i) if not done.has(m, d.name, p.id)])
            for d in loaded for i, p in enumerate(d.prompts)]
    return [w for w in work if w.labels]


def pending_batches(jobs: list[BatchJob], done: Done) -> list[BatchWork]:
    """Batch > 1 work: every job with the labels that have a prompt not done yet; jobs with none left out."""
    work = [BatchWork(job, [label for label in job.labels
                            if any(not done.has(label.method, job.dataset, p.prompt.id, job.batch_size, label.mode)
                                   for p in job.prompts)])
            for job in jobs]
    return [w for w in work if w.labels]


def load_datasets(cfg: RunConfig) -> list[LoadedDataset]:
    """The run's prompts, whichever backend decodes them (--dataset, --limit, --data-file, --per-category); a
    --per-category run of a set without categories is refused."""
    loaded = [LoadedDataset(*ds.load_prompts(name, cfg.limit, cfg.data_file, per_category=cfg.per_category))
              for name in cfg.datasets]
    check_categories(cfg, loaded)
    return loaded


def check_categories(cfg: RunConfig, loaded: list[LoadedDataset]) -> None:
    """--per-category on sets whose records carry no `category`: refused when no set has one (the option would do
    nothing), a note naming the sets that take their first --limit prompts instead when only some have one."""
    if not cfg.per_category:
        return
    plain = [d.name for d in loaded if not any(p.category for p in d.prompts)]
    if len(plain) == len(loaded):
        raise SpecbenchError(f"--per-category: {', '.join(plain)} {'has' if len(plain) == 1 else 'have'} no "
                             "categories (no `category` field in the records); drop --per-category, or use a set "
                             "with categories (mt-bench, a Spec-Bench question file)")
    if plain:
        console.print(f"[yellow]note[/] --per-category: {', '.join(plain)} {'has' if len(plain) == 1 else 'have'} "
                      "no categories: the first --limit prompts are taken there")


def say_batches(cfg: RunConfig, loaded: list[LoadedDataset]) -> None:
    """A batch size above a dataset's prompt count runs with the prompts there are: say so, once per dataset."""
    for d in loaded:
        big = [b for b in cfg.batch_sizes if b > len(d.prompts)]
        if big:
            console.print(f"[yellow]note[/] {d.name} has {len(d.prompts)} prompt(s): batch size(s) "
                          f"{', '.join(map(str, big))} run with {len(d.prompts)} (raise --limit for full batches)")


def fit_prompt(ids: list[int], context: int, max_new_tokens: int, prompt_id: str) -> list[int] | None:
    """A rendered prompt fitted into a `context`-token window with room for --max-new-tokens: truncated from the left
    with a warning, or None (skip the prompt) with a reason when no room is left (specbench's runner and the
    llama.cpp engine alike)."""
    from rich.markup import escape

    room = context - max_new_tokens
    if room < 16:
        console.print(f"[yellow]skip[/] prompt {escape(prompt_id)}: --max-new-tokens {max_new_tokens} leaves no room "
                      f"in the {context}-token context")
        return None
    if len(ids) > room:
        console.print(f"[yellow]warning[/] prompt {escape(prompt_id)}: {len(ids)} tokens exceed the context "
                      f"({context}) minus --max-new-tokens; kept the last {room}")
        ids = ids[-room:]
    return ids

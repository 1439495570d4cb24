"""The warning a run on random weights (`--model random:NAME`) carries at the top of its report: such a model times
like the real one of its shape, but what it accepts says nothing about a trained model."""

from __future__ import annotations

WARNING = ("**Random weights** ({spec}): latency and memory are those of the model's shape, but tau, acceptance and "
           "every speedup here say nothing about a trained model (its guesses are of random logits). Plan a real "
           "model's methods with `specbench plan --model {spec} --acceptance published`.")


def is_random(spec: str | None) -> bool:
    return isinstance(spec, str) and spec.startswith("random:")


def lines(meta: dict) -> list[str]:
    """report.md lines (with a blank after) for a run whose target or drafter has random weights; [] otherwise."""
    model = meta.get("model") or {}
    spec = model.get("spec") if isinstance(model, dict) else None
    if not is_random(spec):
        return []
    return ["> " + WARNING.format(spec=spec), ""]

"""One step's entry in Generation.timeline: when the drafter and the target were busy during a decoding step
(every batchable method's loop and PEARL's scheduler write them; report/timeline.py draws and sums them, and lists
the fields)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A busy stretch in perf_counter seconds (core/machine/timing.now, after the device's work finished)."""

    start: float
    end: float


def timeline_entry(mode: str, origin: float, t0: float, t1: float, draft: Span | None, target: Span | None,
                   checked: int, accepted: int, emitted: int, sampled: bool) -> dict:
    """One timeline entry (its fields: report/timeline.py); times are made relative to `origin`, the
    generation's start."""
    def rel(span):
        return None if span is None else [round(span.start - origin, 6), round(span.end - origin, 6)]

    return {"mode": mode, "t0": round(t0 - origin, 6), "t1": round(t1 - origin, 6), "draft": rel(draft),
            "target": rel(target), "checked": checked, "accepted": accepted, "emitted": emitted,
            "sampled": int(sampled)}

"""Benchmark: how fast can `sd` be with this drafter on this machine? Acceptance along the target's own greedy
replies to benchmark prompts, replayed under the measured forward costs for fixed gammas and for a confidence
stop (draft while the drafter's top probability is at least a threshold, up to gamma).

Greedy `sd` is exactly replayable: a draft token is kept iff it equals the target's argmax after the same prefix,
so the drafter's argmax along the target's greedy reply (teacher-forced) gives every step's accepted count. The
replay's cost per step is gamma drafter forwards + one target forward of width gamma + 1, each measured here
(core/machine/forward_cost.measure_forward_times); `ar` costs one width-1 forward per token. Python overhead
outside the forwards is left out, so the replay reads a little above a real `specbench run` (benchmarks/RESULTS-cpu.md sets a replay
beside the run it replays).
It also prints the per-position acceptance a 1.3x speedup would need at each gamma.

    python benchmarks/sd_ceiling.py [--drafter PATH] [--dataset gsm8k --dataset humaneval] [--limit 20]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from specbench.core.machine.forward_cost import measure_forward_times
from specbench.core.model.load import load_model
from specbench.train.selfdistill import training_sequences
from specbench.methods.sd.drafter import default_drafter, resolve_drafter

GAMMAS = (1, 2, 3, 4, 6, 8)
THRESHOLDS = (None, 0.3, 0.5, 0.7)  # None: always draft gamma tokens (plain sd)


@torch.inference_mode()
def replies(target, drafter, dataset: str, limit: int, new_tokens: int) -> list[tuple[list[bool], list[float]]]:
    """Per prompt: (drafter argmax == target argmax, drafter top probability) at each reply position."""
    out = []
    for seq, first in training_sequences(target, dataset, 0, limit, new_tokens):
        ids = torch.tensor([seq], device=target.device)
        want = target.model(input_ids=ids).logits[0, first - 1:-1].argmax(-1)  # [reply]
        conf, guess = F.softmax(drafter.model(ids).logits[0, first - 1:-1].float(), -1).max(-1)
        out.append(((guess == want).tolist(), conf.tolist()))
    return out


def replay(data, gamma: int, threshold: float | None, draft_s: float, target_s: dict[int, float]) -> float:
    """Speedup of greedy sd over ar on the recorded replies (draft at least 1 token per step)."""
    sd_s = ar_s = 0.0
    for match, conf in data:
        i = 0
        while i < len(match):
            drafted = accepted = 0
            kept = True
            while drafted < gamma and i + drafted < len(match):
                if drafted and threshold is not None and conf[i + drafted] < threshold:
                    break
                kept = kept and match[i + drafted]
                accepted += kept
                drafted += 1
            sd_s += drafted * draft_s + target_s[drafted + 1]
            ar_s += (accepted + 1) * target_s[1]
            i += accepted + 1
    return ar_s / sd_s


def needed_acceptance(gamma: int, goal: float, draft_s: float, target_s: dict[int, float]) -> float:
    """The per-position acceptance a at which plain sd reaches `goal` (tokens/step = (1 - a^(g+1)) / (1 - a))."""
    step = gamma * draft_s + target_s[gamma + 1]
    lo, hi = 0.0, 1.0
    for _ in range(40):
        a = (lo + hi) / 2
        tokens = sum(a ** k for k in range(gamma + 1))
        lo, hi = (a, hi) if tokens * target_s[1] / step < goal else (lo, a)
    return hi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafter", default=None, help="drafter artefact or model (default: the shipped one)")
    parser.add_argument("--dataset", action="append", help="repeatable (default: gsm8k and humaneval)")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()

    target = load_model(args.model)
    drafter = resolve_drafter(args.drafter, target) if args.drafter else default_drafter(target)
    target_s = measure_forward_times(target.model, target.device, tuple(range(1, max(GAMMAS) + 2)))
    draft_s = measure_forward_times(drafter.model, drafter.device)[1]
    print(f"drafter {drafter.spec}: forward {draft_s * 1e3:.1f} ms; target forward by width (ms): "
          + ", ".join(f"{w}: {s * 1e3:.1f}" for w, s in target_s.items()))
    print("acceptance needed for 1.3x, plain sd: "
          + ", ".join(f"gamma {g}: {needed_acceptance(g, 1.3, draft_s, target_s):.2f}" for g in GAMMAS[:4]))
    for dataset in args.dataset or ["gsm8k", "humaneval"]:
        data = replies(target, drafter, dataset, args.limit, args.max_new_tokens)
        rate = sum(sum(m) for m, _ in data) / sum(len(m) for m, _ in data)
        print(f"\n{dataset} (first {args.limit}, {args.max_new_tokens} tokens): drafter agrees with the target at "
              f"{rate:.1%} of positions. Replayed sd speedup over ar:")
        print("gamma  " + "  ".join("plain" if t is None else f"conf>={t}" for t in THRESHOLDS))
        for g in GAMMAS:
            print(f"{g:>5}  " + "  ".join(f"{replay(data, g, t, draft_s, target_s):>{5 if t is None else 9}.3f}x"
                                          for t in THRESHOLDS))


if __name__ == "__main__":
    main()

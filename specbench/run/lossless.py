"""Explain a lossless-check mismatch: rounding (a near-tie the dtype can flip) or a defect.

At temperature 0 `ar` emits the argmax of one-token forwards; a speculative method checks several tokens in one
batched forward. In bf16/fp16 the batched forward rounds differently (other kernel tiling, other reduction order,
every activation rounded to 8 or 11 significant bits), so where ar's best and second-best logits are closer than
that rounding the method can pick the runner-up and the texts diverge from there: that is numerics, not a bug.

explain_mismatch re-runs the target once over the shared prefix (prompt + the tokens both emitted before the first
difference) and measures ar's margin at the differing position:

  gap     = logit[ar's token] - logit[method's token]   (>= 0 up to rounding: ar's token is the argmax at T = 0)
  verdict = "near-tie"     when |gap| <= near_tie_tolerance(max |logit| there, dtype, layers)
            "unexplained"  otherwise (a wrong token the dtype cannot account for: look for a bug)

The tolerance (see near_tie_tolerance) is 8 ulps of max |logit| in the model's dtype plus 128 ulps in float32:
wide in bf16, tiny in float32, where a defect is never excused (docs/measurement.md works it out for a model).
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from ..core.batch.cache import new_cache
from ..core.batch.forward import forward
from ..core.model.load import LoadedModel

NEAR_TIE = "near-tie"
UNEXPLAINED = "unexplained"

# Calibration (benchmarks/lossless_tolerance.py; the numbers it gave: docs/measurement.md, "How the near-tie
# tolerance was set"): the top-1 minus top-2 margin of ar's one-token forwards moves, in a batched forward over the
# same prefix (the whole prefix at once, or verify chunks), by a few ulps of max |logit| in bf16 and by more ulps in
# float32, which keeps every activation, so what remains there is the reordered accumulation of the layers' dot
# products. A flip needs the method's forward to move the margin past zero, and our recomputed gap carries the error
# of one more batched forward, so a genuine rounding flip shows |gap| <= the sum of two such errors; the constants
# below take about twice the largest seen. The dtype's own rounding dominates in bf16/fp16 (128 float32 ulps are
# 0.002 bf16 ulps), the float32 term is what is left in float32, where a defect would have to pick a token within
# that small margin of the argmax to pass.
DTYPE_ULPS = 8
FLOAT32_ULPS = 128
CALIBRATION_LAYERS = 30  # deeper models accumulate more: the tolerance grows as sqrt(layers / 30) (random walk)


def effective_eps(dtype: torch.dtype) -> float:
    """Machine epsilon of the arithmetic a forward in `dtype` really does: float32 matmuls run in TF32 (10-bit
    mantissa) or bf16 when torch's float32 matmul precision is lowered from 'highest', and are then not exact."""
    eps = torch.finfo(dtype).eps
    if dtype == torch.float32:
        lowered = {"high": 2.0 ** -10, "medium": 2.0 ** -7}.get(torch.get_float32_matmul_precision())
        if lowered or torch.backends.cuda.matmul.allow_tf32:
            eps = max(eps, lowered or 2.0 ** -10)
    return eps


def near_tie_tolerance(max_abs_logit: float, dtype: torch.dtype, layers: int = CALIBRATION_LAYERS) -> float:
    """The largest |gap| (logits) a batched-vs-one-token rounding difference can explain at a position whose
    largest |logit| is max_abs_logit (calibration and constants: see the comment above DTYPE_ULPS)."""
    depth = math.sqrt(max(1.0, layers / CALIBRATION_LAYERS))
    ulps = DTYPE_ULPS * effective_eps(dtype) + FLOAT32_ULPS * torch.finfo(torch.float32).eps
    return abs(max_abs_logit) * ulps * depth


def verdict(gap: float, tolerance: float) -> str:
    """near-tie when |gap| is within the tolerance (a negative gap means the recomputation itself prefers the
    method's token: only a near-tie when small), unexplained otherwise (or when the gap is not a number)."""
    return NEAR_TIE if math.isfinite(gap) and abs(gap) <= tolerance else UNEXPLAINED


@torch.inference_mode()
def explain_mismatch(target: LoadedModel, prompt_ids, ar_tokens: list[int], method_tokens: list[int],
                     index: int) -> tuple[float, str]:
    """(gap, verdict) at the first mismatch `index` (the i of "mismatch@i") of method_tokens against ar_tokens.

    prompt_ids: the prompt the turn was generated from ([1, n] tensor as the runner has it, or a list of ids).
    One plain forward (fresh cache) over prompt + ar_tokens[:index]; ar's logits at the next position give
    gap = logit[ar_tokens[index]] - logit[method_tokens[index]]. When one sequence ended at `index` (no token to
    compare) the mismatch is a length difference, which rounding cannot cause: (nan, "unexplained")."""
    if index < 0 or index >= len(ar_tokens) or index >= len(method_tokens):
        return math.nan, UNEXPLAINED
    device = target.device
    prompt = prompt_ids if isinstance(prompt_ids, torch.Tensor) else torch.tensor([list(prompt_ids)])
    prompt = prompt.reshape(1, -1).to(device)
    ids = torch.cat([prompt, torch.tensor([list(ar_tokens[:index])], dtype=prompt.dtype, device=device)], dim=1)
    model = target.model
    logits = forward(model, ids, new_cache(model), logits_to_keep=1)[-1].float()  # [V], in the model's rounding
    a, m = int(ar_tokens[index]), int(method_tokens[index])
    gap = float(logits[a] - logits[m])
    layers = getattr(model.config, "num_hidden_layers", CALIBRATION_LAYERS) or CALIBRATION_LAYERS
    tol = near_tie_tolerance(float(logits.abs().max()), target.dtype, layers)
    return gap, verdict(gap, tol)


# ---------------------------------------------------------------- verdicts of recorded turns (reports, recommend)

def lossless_verdicts(records: pd.DataFrame) -> pd.Series:
    """Per record: "" (not checked: T > 0 or ar), "match", "near-tie", "unexplained", or "no verdict" (a mismatch in
    a run older than the near-tie check, which counts as unexplained)."""
    lossless = records["lossless"].astype(str) if "lossless" in records else pd.Series("", index=records.index)
    explained = (records["mismatch_explained"].astype(str) if "mismatch_explained" in records
                 else pd.Series("", index=records.index))
    mismatch = lossless.str.startswith("mismatch")
    out = pd.Series("", index=records.index, dtype=object)
    out[lossless == "match"] = "match"
    out[mismatch] = "unexplained"
    out[mismatch & (explained == "near-tie")] = "near-tie"
    out[mismatch & (explained.isin(["", "nan"]) | explained.str.startswith("no verdict"))] = "no verdict"
    return out


def explained_rate(g: pd.DataFrame) -> float:
    """(exact matches + near-tie mismatches) / checked turns."""
    v = lossless_verdicts(g)
    v = v[v != ""]
    return round(v.isin(["match", "near-tie"]).mean(), 3) if len(v) else math.nan

"""EMS-SD's padding model (Appendix B): how much of the KV cache the vanilla (padded) way of batching wastes.

Each decoding step, sample i of a batch of B emits A_i tokens (its accepted drafts plus the one correction / bonus
token, so A_i >= 1). With next-token prediction accuracy p and maximum acceptance length K (draft length + 1), A is
a truncated geometric: P(A = n) = p^(n-1) (1 - p) for n < K and P(A = K) = p^(K-1), so E[A] = (1 - p^K) / (1 - p).
The padded batch keeps every sample's KV cache at the longest accepted length of the step, M = max_i A_i, so sample
i writes P_i = M - A_i padding entries: E[P] = E[M] - E[A], and the padding ratio R = E[P] / E[M] (the share of
the KV entries written that are padding: Appendix B's prose figures, 30% wasted at p = 0.9, over 50% below p = 0.8
with B > 8, are this ratio's). The ratios EMS-SD measures in its experiments (Fig. 4: above 115% for OPT-13B;
Table 6: 89% on GSM8K) pass 100%, which only padding per accepted token can: R_acc = E[P] / E[A], measured as
kv_padding / new tokens. Both are given (our copy of the paper lost Eq. 10's symbols; the two differ by E[M] / E[A]).

The paper simulates these numerically (Figure 7, K = 8); `exact` computes them from the CDF,
P(M <= m) = P(A <= m)^B, and `simulate` repeats the paper's Monte Carlo. `measured` puts a padded run's measured
KV padding ratio beside the model's at the run's tau, batch size and draft length.
"""

from __future__ import annotations

import math

import pandas as pd

from ..errors import SpecbenchError

MEASURED_COLUMNS = ["method", "dataset", "batch_size", "rows", "new_tokens", "kv_padding", "tau", "K", "p",
                    "R_measured", "R_model", "R_acc_measured", "R_acc_model"]


def _check(p: float, batch: int, max_accept: int) -> None:
    """Refuse values the model has no meaning for (p is closed here: tau = 1 or K inverts to p = 0 or 1)."""
    if not 0.0 <= p <= 1.0:
        raise SpecbenchError(f"next-token accuracy p must be in [0, 1] (got {p})")
    if batch < 1:
        raise SpecbenchError(f"batch size must be at least 1 (got {batch})")
    if max_accept < 1:
        raise SpecbenchError(f"maximum acceptance length K must be at least 1 (got {max_accept})")


def _stats(mean_accept: float, mean_max: float) -> dict:
    """The model's numbers from E[A] and E[M]: R = E[P] / E[M] (padding's share, <= 100%), R_acc = E[P] / E[A]
    (padding per accepted token, EMS-SD's measured form, can pass 100%)."""
    padding = mean_max - mean_accept
    return {"E[A]": mean_accept, "E[M]": mean_max, "E[P]": padding, "R": padding / mean_max,
            "R_acc": padding / mean_accept}


def _cdf(p: float, m: int, max_accept: int) -> float:
    """P(A <= m): A > m needs m correct predictions in a row (and m < K)."""
    return 1.0 if m >= max_accept else 1.0 - p ** m


def exact(p: float, batch: int, max_accept: int) -> dict:
    """E[A], E[M], E[P] and R = E[P] / E[M] (share of the KV entries written per step that are padding), exactly."""
    _check(p, batch, max_accept)
    # E[X] = sum over m >= 0 of P(X > m) for X in 1..K; P(M > m) = 1 - P(A <= m)^B (samples are independent)
    mean_accept = sum(1.0 - _cdf(p, m, max_accept) for m in range(max_accept))
    mean_max = sum(1.0 - _cdf(p, m, max_accept) ** batch for m in range(max_accept))
    return _stats(mean_accept, mean_max)


def simulate(p: float, batch: int, max_accept: int, steps: int = 20000, seed: int = 0) -> dict:
    """The same numbers by Monte Carlo over `steps` decoding steps, as the paper computes them."""
    import torch

    _check(p, batch, max_accept)
    g = torch.Generator().manual_seed(seed)
    # each of the K - 1 draft positions is predicted right with probability p; a sample accepts its leading run of
    # right predictions, plus the token the target adds
    right = torch.rand(steps, batch, max_accept - 1, generator=g) < p
    accepted = right.to(torch.int64).cumprod(-1).sum(-1) + 1  # [steps, batch]
    # R is a ratio of means (all padding over all KV written), as the paper defines it, not a mean of ratios
    return _stats(accepted.double().mean().item(), accepted.max(-1).values.double().mean().item())


def accuracy_from_tau(tau: float, max_accept: int) -> float:
    """The p whose E[A] equals a measured tau (mean tokens per target forward), by bisection."""
    if max_accept < 1:
        raise SpecbenchError(f"maximum acceptance length K must be at least 1 (got {max_accept})")
    if not 1.0 <= tau <= max_accept:
        raise SpecbenchError(f"tau {tau:g} is outside [1, K = {max_accept}]: every step emits between 1 and K "
                             "tokens, so no accuracy p gives it")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # E[A] rises monotonically in p; 60 halvings reach float precision
        mid = (lo + hi) / 2
        if exact(mid, 1, max_accept)["E[A]"] < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def table(ps, batches, max_accept: int) -> list[dict]:
    """One row per (p, B): p, B, E[A], E[M], E[P], R, R_acc."""
    return [{"p": p, "B": b, **exact(p, b, max_accept)} for p in ps for b in batches]


def _positions(text) -> int:
    """Draft positions in an accepted_per_position cell ("a1/d1 a2/d2 ..."; empty: the sample never drafted)."""
    return len(text.split()) if isinstance(text, str) else 0


def _model_ratio(tau: float, batch: int, max_accept: float) -> tuple[float, float, float]:
    """(p, R, R_acc) the model gives at a measured tau; NaN where K is unknown or tau lies outside [1, K]."""
    if math.isnan(max_accept):
        return math.nan, math.nan, math.nan
    try:
        p = accuracy_from_tau(tau, int(max_accept))
    except SpecbenchError:  # e.g. a method whose step can emit more than its draft positions + 1
        return math.nan, math.nan, math.nan
    model = exact(p, batch, int(max_accept))
    return p, model["R"], model["R_acc"]


def measured(records: pd.DataFrame) -> pd.DataFrame:
    """Measured KV padding ratio of a run's padded batches beside the model's, per method x dataset x batch size."""
    if not {"batch_size", "batching", "kv_padding"} <= set(records):  # runs from before batching existed
        return pd.DataFrame(columns=MEASURED_COLUMNS)
    df = records[records["batching"].astype(str) == "padded"].copy()
    for col in ("batch_size", "kv_padding", "new_tokens", "target_forwards"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df = df[df["batch_size"] > 1]
    rows = []
    for (method, dataset, batch), g in df.groupby(["method", "dataset", "batch_size"], sort=True):
        new, pad, forwards = g["new_tokens"].sum(), g["kv_padding"].sum(), g["target_forwards"].sum()
        # K = the longest draft the records show + 1; unknown when the run did not record per-position counts
        k = g["accepted_per_position"].map(_positions).max() + 1 if "accepted_per_position" in g else math.nan
        tau = new / forwards if forwards else math.nan
        p, r_model, acc_model = (_model_ratio(tau, int(batch), k) if not math.isnan(tau)
                                 else (math.nan, math.nan, math.nan))
        rows.append({"method": method, "dataset": dataset, "batch_size": int(batch), "rows": len(g),
                     "new_tokens": int(new), "kv_padding": int(pad), "tau": tau, "K": k, "p": p,
                     "R_measured": pad / (pad + new) if pad + new else math.nan, "R_model": r_model,
                     "R_acc_measured": pad / new if new else math.nan, "R_acc_model": acc_model})
    return pd.DataFrame(rows, columns=MEASURED_COLUMNS)

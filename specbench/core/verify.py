"""Verification math: pure functions of tensors (no model, cache or global state).

Notation (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", Alg. 1):
p = target distribution, q = draft distribution, x_1..x_k = drafted tokens.
Target logits/probs are given for k+1 positions: position i scores the token after x_1..x_i
(position 0 scores x_1, position k is the bonus position after the last draft).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. temperature 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def warp_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Logits [..., V] -> the distribution actually sampled from [..., V] (temperature, top-k, top-p), float32."""
    logits = logits.float() / max(sampling.temperature, 1e-6)
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= sampling.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def uniform(generator: torch.Generator | None) -> float:
    """One draw of U(0, 1), made on the generator's device (a CUDA generator cannot fill a CPU tensor)."""
    device = None if generator is None else generator.device
    return float(torch.rand((), generator=generator, device=device))


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from probs [V], on the generator's device."""
    probs = probs if generator is None else probs.to(generator.device)  # [V]
    return int(torch.multinomial(probs, 1, generator=generator).item())


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """One token from logits [V]: argmax when greedy, else a sample of the warped distribution."""
    if sampling.greedy:
        return int(logits.argmax(-1).item())
    return sample(warp_probs(logits, sampling), generator)


def greedy_accept(draft: torch.Tensor, target_logits: torch.Tensor, bonus: bool = True) -> tuple[int, int | None]:
    """Longest prefix of draft [k] equal to the target's argmax; returns (accepted count, next token).

    target_logits: [k+1, V]. The next token is the target's argmax after the accepted prefix (correction on a
    mismatch, bonus token when all k are accepted). With bonus=False target_logits is [k, V] and the next token is
    None when all k are accepted (PEARL's post-verify keeps drafting instead of taking a bonus token).
    """
    k = draft.shape[0]
    if k == 0:  # nothing drafted (ar): the argmax of the one row, with no comparison to read back first
        return 0, (int(target_logits[0].argmax()) if bonus else None)
    choice = target_logits.argmax(-1)  # [k+1] ([k] without bonus)
    mismatch = (draft != choice[:k]).nonzero()
    n = int(mismatch[0, 0]) if mismatch.numel() else k
    return n, (int(choice[n]) if n < k or bonus else None)


def speculative_accept(
    draft: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
    bonus: bool = True,
) -> tuple[int, int | None]:
    """Speculative sampling (Leviathan et al. 2023, Alg. 1); returns (accepted count, next token).

    draft: [k] drafted tokens; p: [k+1, V] target probabilities; q: [k, V] draft probabilities, or None when the
    draft was deterministic (one-hot q, as in prompt lookup), where accepting x with probability p(x) and
    resampling from p with x removed is the same rule.
    Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); on the first rejection sample from
    norm(max(0, p_i - q_i)); when all k are accepted sample the bonus token from p_k. The emitted tokens are then
    distributed exactly as p. bonus=False: p is [k, V] and the next token is None when all k are accepted.
    """
    k = draft.shape[0]
    for i in range(k):
        x = int(draft[i])
        px = float(p[i, x])
        qx = 1.0 if q is None else float(q[i, x])
        if qx > 0 and uniform(generator) < min(1.0, px / qx):
            continue
        if q is None:
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = (p[i] - q[i]).clamp_min(0.0)
        total = float(residual.sum())
        if total <= 0.0:  # p == q up to rounding: any sample from p is exact
            residual, total = p[i], float(p[i].sum())
        return i, sample(residual / total, generator)
    return k, (sample(p[k], generator) if bonus else None)


def accept(
    draft: torch.Tensor,
    target_logits: torch.Tensor,
    sampling: Sampling,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
    bonus: bool = True,
) -> tuple[int, int | None]:
    """Greedy prefix match at temperature 0, speculative sampling otherwise. target_logits: [k+1, V] ([k, V]
    with bonus=False, when the next token is None if all k drafts are accepted)."""
    if sampling.greedy:
        return greedy_accept(draft, target_logits, bonus)
    return speculative_accept(draft, warp_probs(target_logits, sampling), q, generator, bonus)


# ------------------------------------------------------------------------------------------ tree verification
# A tree step scores N nodes at once: node 0 is the root (the last accepted token), node i > 0 a candidate token
# tokens[i] whose parent is parents[i] (parents before children). logits[i] [V] is the target's next-token
# distribution after the path root .. i. Each function returns (accepted path of node indices from the root,
# inclusive, and the next token): the emitted tokens are tokens[path[1:]] followed by the next token.

def _path_to(node: int, parents: list[int]) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def _children(parents: list[int]) -> list[list[int]]:
    """Each node's children, in node order (parents before children)."""
    out: list[list[int]] = [[] for _ in parents]
    for i in range(1, len(parents)):
        out[parents[i]].append(i)
    return out


def _deepest(ok: list[bool], parents: list[int]) -> list[int]:
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    best = max((i for i in range(len(ok)) if ok[i]), key=lambda i: (depth[i], -i))
    return _path_to(best, parents)


def tree_greedy_accept(tokens: torch.Tensor, parents: list[int], logits: torch.Tensor) -> tuple[list[int], int]:
    """The longest path whose tokens equal the target's argmax at their parents (exact match; lossless)."""
    choice = logits.argmax(-1).tolist()  # [N]
    toks = tokens.tolist()
    ok = [True] + [False] * (len(toks) - 1)
    for i in range(1, len(toks)):
        ok[i] = ok[parents[i]] and toks[i] == choice[parents[i]]
    path = _deepest(ok, parents)
    return path, choice[path[-1]]


def tree_typical_accept(tokens: torch.Tensor, parents: list[int], logits: torch.Tensor, sampling: Sampling,
                        generator: torch.Generator | None, threshold: float = 0.09,
                        alpha: float = 0.3) -> tuple[list[int], int]:
    """Typical acceptance (Medusa §2.3.1, used by PPD at T > 0): a candidate x is accepted when its parent was and
    p(x) > min(threshold, alpha * exp(-H(p))) under the parent's warped distribution p; the next token is sampled
    from the last accepted node. LOSSY: the output distribution is not the target's. Greedy = exact match."""
    if sampling.greedy:
        return tree_greedy_accept(tokens, parents, logits)
    probs = warp_probs(logits, sampling)  # [N, V]
    entropy = -(probs * probs.clamp_min(1e-20).log()).sum(-1)  # [N]
    limit = torch.minimum(torch.full_like(entropy, threshold), alpha * torch.exp(-entropy)).tolist()
    toks = tokens.tolist()
    ok = [True] + [False] * (len(toks) - 1)
    for i in range(1, len(toks)):
        par = parents[i]
        ok[i] = ok[par] and float(probs[par, toks[i]]) > limit[par]
    path = _deepest(ok, parents)
    return path, sample(probs[path[-1]], generator)


def tree_speculative_accept(tokens: torch.Tensor, parents: list[int], logits: torch.Tensor, sampling: Sampling,
                            generator: torch.Generator | None) -> tuple[list[int], int]:
    """Multi-candidate speculative sampling over siblings (SpecInfer, Miao et al. 2024, §4.2; deterministic
    drafts): at a node with target distribution p, try its children x_1, x_2, ... in order; accept x_i with
    probability p(x_i), else set p(x_i) = 0 and renormalise; after an acceptance descend into that child, when
    every child is rejected sample the next token from the residual p. Each emitted token is distributed exactly
    as the target's (lossless). Greedy = exact match."""
    if sampling.greedy:
        return tree_greedy_accept(tokens, parents, logits)
    toks = tokens.tolist()
    children = _children(parents)
    node = 0
    while True:
        p = warp_probs(logits[node], sampling)  # [V]
        accepted = None
        for child in children[node]:
            x = toks[child]
            if uniform(generator) < float(p[x]):
                accepted = child
                break
            p[x] = 0.0
            p = p / p.sum()  # p(x) < 1 here (p(x) = 1 is always accepted), so the sum is positive
        if accepted is None:
            return _path_to(node, parents), sample(p, generator)
        node = accepted


def sample_children(q: torch.Tensor, count: int, generator: torch.Generator | None) -> torch.Tensor:
    """count i.i.d. draws (with replacement) from q [V] -> [count] token ids (on q's device); the draws are made on
    the generator's device. These are the children that `tree_sampled_accept` expects of a node with draft q."""
    if count <= 0:
        return torch.empty(0, dtype=torch.long, device=q.device)
    probs = q.float() if generator is None else q.float().to(generator.device)  # [V]
    return torch.multinomial(probs, count, replacement=True, generator=generator).to(q.device)  # [count]


def tree_sampled_accept(tokens: torch.Tensor, parents: list[int], logits: torch.Tensor, draft_q: torch.Tensor,
                        sampling: Sampling, generator: torch.Generator | None) -> tuple[list[int], int]:
    """Multi-candidate speculative sampling over siblings drawn from a draft distribution (SpecInfer, Miao et al.
    2024, §4.2 multi-step speculative sampling; ParallelSpec Alg. 1).

    tokens: [N] (node 0 = root); logits: [N, V] target logits after each node's path; draft_q: [N, V] the (already
    warped) draft distribution that node i's children were drawn from, i.i.d. with replacement (see
    `sample_children`; duplicate siblings are allowed; rows of leaves are ignored).
    At a node with target distribution p and draft q, try its children x_1, x_2, ... in order: accept x_i with
    probability min(1, p(x_i) / q(x_i)), else set p = norm(max(0, p - q)) and try the next child against that
    residual and the same q; after an acceptance descend into that child, when every child is rejected (or the
    node is a leaf) sample the next token from the current p. Since each child is an independent draw from q, every
    emitted token is distributed exactly as the target's (lossless). Edge cases: a child with q(x) = 0 cannot
    have been drawn from q; it is rejected and p is left unchanged. A residual of sum 0 (p == q up to rounding)
    falls back to p before the subtraction, as `speculative_accept` does. Greedy = exact match.
    """
    if sampling.greedy:
        return tree_greedy_accept(tokens, parents, logits)
    toks = tokens.tolist()
    children = _children(parents)
    node = 0
    while True:
        p = warp_probs(logits[node], sampling)  # [V]
        q = draft_q[node].float() if children[node] else None  # [V]
        accepted = None
        for child in children[node]:
            x = toks[child]
            px, qx = float(p[x]), float(q[x])
            if qx <= 0.0:  # not a draw from q: reject without touching p
                continue
            if uniform(generator) < min(1.0, px / qx):
                accepted = child
                break
            residual = (p - q).clamp_min(0.0)  # [V]
            total = float(residual.sum())
            if total > 0.0:  # else p == q up to rounding: any sample from p is exact, keep it
                p = residual / total
        if accepted is None:
            return _path_to(node, parents), sample(p, generator)
        node = accepted

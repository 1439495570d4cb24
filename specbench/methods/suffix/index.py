"""A suffix index over token sequences and the speculation tree it proposes (SuffixDecoding: Oliaro et al. 2024,
"SuffixDecoding: Extreme Speculative Decoding for Emerging AI Applications", §3).

The paper keeps a suffix tree of bounded depth: each node is a pattern P, its count the number of places P occurs
(suffixes passing through or ending at it), a child P + c counts the places P is followed by c. This index answers
the same questions from occurrence lists (token -> every place it occurs), O(N) memory: the places where P ends are
the last token's places, filtered one earlier token at a time; a child's count is how many of them continue with c.
Every pattern plus continuation stays within `max_depth` tokens, as a tree of that depth bounds it.

Speculation (§3.2, §3.3): for each match length p of the context's end (1, 2, ... while the pattern still occurs) a
tree of at most MAX_SPEC = alpha * p + offset tokens (the offset: ArcticInference's max_spec_offset) is grown
best-first by its nodes' scores D(N) = the product of
count(child) / count(parent) along its path (the empirical probability of reaching it), stopping below
`min_prob`; a tree's score is the sum of its nodes' D. The best-scoring tree over all p is the draft (ties go to
the longer match, as ArcticInference's speculate does).

D(N) estimates the chance that the target agrees with N's whole path, so a tree's expected accepted tokens are
1 + its score, and `Draft.cut` keeps the first n nodes (best-first order: D never rises along it) that give the
most expected tokens per unit of the verify forward's cost on a latency curve."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

Place = tuple[int, int]  # (sequence id, index of a token in it)


@dataclass
class Draft:
    """A speculation tree: tokens in the order they were chosen (a parent before its children), each one's parent
    (an index into tokens; -1: the root, i.e. the context's last token) and score D."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)  # each token's depth below the root (1: the next token)
    match_len: int = 0

    @property
    def score(self) -> float:
        return sum(self.probs)

    def paths(self) -> list[tuple[int, ...]]:
        """Each token's root-to-node path of sibling ranks (core/tree.Tree's node names), in token order."""
        paths: list[tuple[int, ...]] = []
        children: dict[int, int] = {}
        for parent in self.parents:
            rank = children.get(parent, 0)
            children[parent] = rank + 1
            paths.append((paths[parent] if parent >= 0 else ()) + (rank,))
        return paths

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    def first(self, count: int) -> Draft:
        """The tree of its first `count` tokens (a parent comes before its children, so it is a tree)."""
        return Draft(self.tokens[:count], self.parents[:count], self.probs[:count], self.depths[:count],
                     self.match_len)

    def cut(self, costs: list[float]) -> Draft:
        """The first n tokens maximising (1 + their scores) / costs[n], where costs[n] is a verify forward of n + 1
        inputs (the root and n nodes) relative to a one-token forward: the expected tokens a step emits per unit of
        its forward's time. Nodes beyond the curve's widest width are never kept."""
        best, value, expected = 0, 1.0, 1.0
        for n, prob in enumerate(self.probs[:len(costs) - 1], start=1):
            expected += prob
            if expected / costs[n] > value:
                best, value = n, expected / costs[n]
        return self.first(best)


class SuffixIndex:
    """Sequences of token ids and where each token occurs in them; sequences can be added to and retired."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.seqs: dict[int, list[int]] = {}
        self.places: dict[int, list[Place]] = {}  # token -> its places, in the order they were added
        self.retired: set[int] = set()  # sequence ids no longer matched (their places are skipped)

    def extend(self, seq_id: int, tokens: list[int]) -> None:
        seq = self.seqs.setdefault(seq_id, [])
        for token in tokens:
            self.places.setdefault(token, []).append((seq_id, len(seq)))
            seq.append(token)

    def retire(self, seq_id: int) -> None:
        """Stop matching a sequence (its places stay in the lists and are skipped)."""
        if seq_id in self.seqs:
            self.retired.add(seq_id)
            self.seqs[seq_id] = []

    def live(self, exclude: frozenset[int] = frozenset()) -> int:
        """Sequences still matched, other than `exclude`."""
        return sum(1 for s, seq in self.seqs.items() if seq and s not in self.retired and s not in exclude)

    def speculate(self, context: list[int], max_tokens: int, alpha: float, min_prob: float,
                  exclude: frozenset[int] = frozenset(), deepest: int | None = None, offset: float = 0.0,
                  unseen: int = 0) -> Draft:
        """The best-scoring speculation tree for what follows `context`, from every sequence but `exclude`, no
        deeper than `deepest` tokens (None: the index's depth bound alone), of at most alpha * p + offset tokens
        for a match of p tokens (and `max_tokens`). `unseen`: occurrences of the pattern this index does not hold
        (the context's own end, for an index without the request's text), counted among the first depth's places
        as a suffix tree over that text would count them."""
        context = context[-self.max_depth:]
        if not context or max_tokens <= 0 or deepest == 0:
            return Draft()
        skip = self.retired | exclude
        ends = [(s, j) for s, j in self.places.get(context[-1], ()) if s not in skip]
        best = Draft()
        grown = None  # the best-first expansion of the current places, resumed as the budget grows
        for p in range(1, len(context)):
            if not ends or not any(j + 1 < len(self.seqs[s]) for s, j in ends):
                break  # no place of the pattern has a continuation: longer matches draft nothing either
            budget = min(max_tokens, int(alpha * p + offset + 1e-6))
            reach = self.max_depth - p if deepest is None else min(deepest, self.max_depth - p)
            if grown is None or grown.places != len(ends):  # ends only shrink as p grows: same count, same places
                grown = _Expansion(self, ends, reach, min_prob, unseen)
            draft = grown.upto(budget)
            if draft.depth > reach:  # the shorter depth bound of this longer match cuts that tree: grow it again
                grown = _Expansion(self, ends, reach, min_prob, unseen)
                draft = grown.upto(budget)
            if draft.tokens and draft.score >= best.score:
                draft.match_len = p
                best = draft
            before = context[-p - 1]  # the pattern one token longer: the places it is preceded by that token
            ends = [(s, j) for s, j in ends if j - p >= 0 and self.seqs[s][j - p] == before]
        return best

    def _children(self, members: list[Place], depth: int) -> list[tuple[int, list[Place]]]:
        """The places `members` (ends of a pattern of length p, continued by `depth` - 1 tokens) grouped by the token
        at continuation depth `depth`: the most frequent first, the most recent first among equals (a place added
        later compares higher: a later sequence id, or a later index in the same sequence)."""
        groups: dict[int, list[Place]] = {}
        seqs = self.seqs
        for place in members:
            seq = seqs[place[0]]
            at = place[1] + depth
            if at < len(seq):
                groups.setdefault(seq[at], []).append(place)
        return sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[1][-1]), reverse=True)



class _Expansion:
    """The tree after a pattern ending at `places`, grown best-first by D (the highest-scoring node next, ties to
    the earlier one): its first b tokens are the tree of budget b, so one expansion serves every budget, resumed
    when a budget asks for more. Nodes deeper than `reach` below the root, or scoring below `min_prob`, are left
    out (the first b tokens of a deeper expansion with none deeper than a smaller reach are that reach's tree)."""

    def __init__(self, index: SuffixIndex, places: list[Place], reach: int, min_prob: float, unseen: int = 0):
        self.index, self.reach, self.min_prob = index, reach, min_prob
        self.places = len(places)
        self.heap: list[tuple[float, int, int, list[Place], int, int]] = []  # (-D, order, token, places, depth, parent)
        self.order = 0
        self.draft = Draft()
        self._push(places, 1, 1.0, -1, unseen)

    def _push(self, members: list[Place], depth: int, prob: float, parent: int, unseen: int = 0) -> None:
        if depth > self.reach:
            return
        for token, group in self.index._children(members, depth):
            child = prob * len(group) / (len(members) + unseen)
            if child < self.min_prob:
                break  # the groups come most frequent first
            heapq.heappush(self.heap, (-child, self.order, token, group, depth, parent))
            self.order += 1

    def upto(self, budget: int) -> Draft:
        """The tree of at most `budget` tokens."""
        draft = self.draft
        while self.heap and len(draft.tokens) < budget:
            neg, _, token, group, depth, parent = heapq.heappop(self.heap)
            draft.tokens.append(token)
            draft.parents.append(parent)
            draft.probs.append(-neg)
            draft.depths.append(depth)
            self._push(group, depth + 1, -neg, len(draft.tokens) - 1)
        return draft.first(budget)

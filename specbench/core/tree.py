"""Tree attention for tree-verified decoding (SpecInfer; Medusa §2.1.2) with PPD's prompt tokens attached to
tree nodes (PPD §4, Fig. 3), and the trees/*.yaml file format.

A tree is the root (the last accepted token, node 0) plus candidate nodes, each named by its root-to-node path of
top-k ranks: (0,) is the top-1 guess for the next token, (0, 2) the top-3 guess for the token after it, under the
top-1 first guess. Every node may carry prompt tokens (PPD): prompt token j of a node at depth d predicts the token
j + 2 positions after the node (PPD §3.1), and with EPT > 1 each prompt token is E ensemble tokens (PPD §3.2).

One forward's input (width q = nodes + prompt inputs) is laid out as
    [root, candidate nodes in tree order | node 0's prompt tokens | node 1's prompt tokens | ...]
with a node's prompt tokens ordered (prompt token j, ensemble copy e). Visibility (the additive mask):
    a node sees the context, its ancestors and itself;
    prompt input (node i, j, e) sees the context, node i's path (root .. i), and (node i, j' <= j, same e).
Position ids: context length + depth for a node; context length + depth(i) + 1 + j for prompt input (i, j, e).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path as FsPath

import torch
import yaml

from ..errors import SpecbenchError
from . import store
from .structured import read_structured

Path = tuple[int, ...]


@dataclass(frozen=True)
class Tree:
    """Candidate paths (parents before children) and the prompt tokens each node carries (root first)."""

    paths: tuple[Path, ...]
    prompt_tokens: tuple[int, ...] = ()  # len(paths) + 1 entries, root first; () = none anywhere
    ept: int = 1  # ensemble tokens per prompt token

    def __post_init__(self):
        paths = tuple(tuple(int(r) for r in p) for p in self.paths)
        counts = tuple(int(c) for c in self.prompt_tokens) or (0,) * (len(paths) + 1)
        object.__setattr__(self, "paths", paths)
        object.__setattr__(self, "prompt_tokens", counts)
        if len(counts) != len(paths) + 1:
            raise SpecbenchError(f"tree: {len(counts)} prompt-token counts for {len(paths)} candidates plus the "
                                 "root; give one count per node, root first")
        seen: set[Path] = set()
        for p in paths:
            if not p or min(p) < 0:
                raise SpecbenchError(f"tree: path {list(p)} must be a non-empty list of ranks >= 0")
            if p in seen or (len(p) > 1 and p[:-1] not in seen):
                raise SpecbenchError(f"tree: path {list(p)} is repeated or comes before its parent {list(p[:-1])}")
            seen.add(p)
        if min(counts) < 0 or self.ept < 1:
            raise SpecbenchError("tree: prompt-token counts must be >= 0 and ept >= 1")

    @property
    def nodes(self) -> int:
        """Root plus candidates."""
        return len(self.paths) + 1

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    @property
    def width(self) -> int:
        """Tokens in one forward: nodes plus every prompt input."""
        return self.nodes + sum(self.prompt_tokens) * self.ept

    @cached_property
    def parents(self) -> list[int]:
        """Parent node index of every node (root: -1)."""
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        return [-1] + [index[p[:-1]] if len(p) > 1 else 0 for p in self.paths]

    @cached_property
    def children(self) -> list[list[int]]:
        """Each node's children, in node order."""
        out: list[list[int]] = [[] for _ in range(self.nodes)]
        for i in range(1, self.nodes):
            out[self.parents[i]].append(i)
        return out

    @cached_property
    def depths(self) -> list[int]:
        return [0] + [len(p) for p in self.paths]

    @cached_property
    def ancestors(self) -> list[list[int]]:
        """Node indices from the root to each node, inclusive."""
        out: list[list[int]] = [[0]]
        for i in range(1, self.nodes):
            out.append(out[self.parents[i]] + [i])
        return out

    @cached_property
    def prompt_slots(self) -> list[list[list[int]]]:
        """slots[i][j][e] = input index of node i's prompt token j, ensemble copy e."""
        slots, nxt = [], self.nodes
        for count in self.prompt_tokens:
            node = []
            for _ in range(count):
                node.append(list(range(nxt, nxt + self.ept)))
                nxt += self.ept
            slots.append(node)
        return slots

    def visible(self, device=None) -> torch.Tensor:
        """[q, q] bool: input a may attend to input b (the tree part of the mask; the context is always visible)."""
        q = self.width
        vis = torch.zeros(q, q, dtype=torch.bool)
        for i, path in enumerate(self.ancestors):
            vis[i, path] = True
            for j, copies in enumerate(self.prompt_slots[i]):
                for e, slot in enumerate(copies):
                    vis[slot, path] = True
                    vis[slot, [self.prompt_slots[i][jj][e] for jj in range(j + 1)]] = True
        return vis.to(device)

    def offsets(self, device=None) -> torch.Tensor:
        """[q] position of each input relative to the context length."""
        pos = list(self.depths)
        for i, node in enumerate(self.prompt_slots):
            for j, copies in enumerate(node):
                pos += [self.depths[i] + 1 + j] * len(copies)
        return torch.tensor(pos, dtype=torch.long, device=device)

    def prompt_rows(self) -> list[int]:
        """For every prompt input (in input order), the row j * ept + e of the [S * ept, H] embedding table."""
        return [j * self.ept + e for node in self.prompt_slots for j, copies in enumerate(node)
                for e in range(len(copies))]

    def retrieve_indices(self) -> torch.Tensor:
        """[leaves, depth + 1] node indices along every root-to-leaf path, padded with -1 (Medusa's layout)."""
        has_child = set(self.parents[1:])
        leaves = [i for i in range(self.nodes) if i not in has_child]
        rows = torch.full((len(leaves), self.depth + 1), -1, dtype=torch.long)
        for r, leaf in enumerate(leaves):
            path = self.ancestors[leaf]
            rows[r, : len(path)] = torch.tensor(path)
        return rows

    def candidate_tokens(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """topk_ids [D, K] (rank-ordered guesses per depth) -> token of every candidate node [N - 1]."""
        if not self.paths:
            return topk_ids.new_zeros(0)
        depth = torch.tensor([len(p) - 1 for p in self.paths], device=topk_ids.device)
        rank = torch.tensor([p[-1] for p in self.paths], device=topk_ids.device)
        return topk_ids[depth, rank]


def attention_mask(vis: torch.Tensor, past: int, dtype: torch.dtype, prefix: int = 0) -> torch.Tensor:
    """Additive mask [1, 1, prefix + q, past + prefix + q] (0 = attend, dtype min = masked) of visibility()."""
    allowed = visibility(vis, past, prefix)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=vis.device).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def visibility(vis: torch.Tensor, past: int, prefix: int = 0) -> torch.Tensor:
    """Bool [prefix + q, past + prefix + q], True = may attend. vis [q, q] is Tree.visible(). `prefix` causal
    tokens may come before the tree in the same forward (a prefill whose last token is the root): they see the
    context and each other causally; the tree sees all of them."""
    q = vis.shape[0]
    n = prefix + q
    allowed = torch.zeros(n, past + n, dtype=torch.bool, device=vis.device)
    allowed[:, :past] = True
    if prefix:
        allowed[:prefix, past:past + prefix] = torch.ones(prefix, prefix, dtype=torch.bool,
                                                           device=vis.device).tril()
        allowed[prefix:, past:past + prefix] = True
    allowed[prefix:, past + prefix:] = vis
    return allowed


def position_ids(offsets: torch.Tensor, past: int, prefix: int = 0) -> torch.Tensor:
    """[1, prefix + q] positions: the prefix counts up from `past`, tree inputs sit at past + prefix + offset."""
    head = torch.arange(past, past + prefix, device=offsets.device)
    return torch.cat([head, offsets + past + prefix]).unsqueeze(0)


# ------------------------------------------------------------------------------------------- trees/*.yaml

FORMAT_NOTE = """\
# specbench tree file. Nodes are [path of top-k ranks, prompt tokens carried]; one tree per state k (PPD's
# dynamic sparse tree: k = prompt tokens the previously accepted node carried, so state k's candidates are at
# most k deep). The root (the last accepted token) is implicit and carries `prompt_tokens`. `size` counts the
# candidates plus the prompt tokens attached to them in the largest state (root and its tokens not counted).
"""
HEADER_FIELDS = ("format", "method", "model", "hardware", "dtype", "built_by", "source", "prompt_tokens", "size",
                 "predicted_tau")


@dataclass
class TreeFile:
    """A trees/*.yaml file: provenance plus one tree per state (state -> list of (path, prompt tokens))."""

    states: dict[int, list[tuple[Path, int]]]
    prompt_tokens: int  # m: what the root carries; states are 1..m (a tree without prompt tokens: m = 0, state 0)
    model: str = ""
    hardware: str = "any"
    dtype: str = "any"
    built_by: str = ""
    source: str = "measured"  # measured | estimated (a tree from a hardware preset, PPD issue 4)
    predicted_tau: float | None = None
    method: str = "ppd"
    extra: dict = field(default_factory=dict)  # further fields (curves, predicted speedup, ...), kept as written

    @property
    def size(self) -> int:
        return max((len(nodes) + sum(c for _, c in nodes) for nodes in self.states.values()), default=0)

    def tree(self, state: int, ept: int = 1) -> Tree:
        if state not in self.states:
            raise SpecbenchError(f"tree file has no state {state} (states: {sorted(self.states)})")
        nodes = self.states[state]
        return Tree(tuple(p for p, _ in nodes), (self.prompt_tokens,) + tuple(c for _, c in nodes), ept)

    def to_yaml(self) -> str:
        head = {"format": 1, "method": self.method, "model": self.model, "hardware": self.hardware,
                "dtype": self.dtype, "built_by": self.built_by, "source": self.source,
                "prompt_tokens": self.prompt_tokens, "size": self.size,
                "predicted_tau": None if self.predicted_tau is None else round(float(self.predicted_tau), 4)}
        text = FORMAT_NOTE + yaml.safe_dump(head, sort_keys=False, width=120)
        if self.extra:
            text += yaml.safe_dump(self.extra, sort_keys=False, width=120, default_flow_style=None)
        text += "states:\n"
        for state in sorted(self.states):
            text += f"  {state}:\n"
            text += "".join(f"    - [{list(p)}, {c}]\n" for p, c in self.states[state])
        return text

    def write(self, path: str | FsPath) -> None:
        path = FsPath(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.to_yaml())
        except OSError as exc:
            raise SpecbenchError(f"cannot write tree file {path}: {exc.strerror or exc}") from exc


def read_tree_file(path: str | FsPath) -> TreeFile:
    """Load and validate a trees/*.yaml file (errors name the file and the field)."""
    path = FsPath(path)
    data = read_structured(path, f"tree file {path}")

    def bad(what: str) -> SpecbenchError:
        return SpecbenchError(f"tree file {path}: {what}")

    if not isinstance(data, dict) or not isinstance(data.get("states"), dict) or not data["states"]:
        raise bad("needs a `states` mapping (state -> list of [path, prompt tokens])")
    m = data.get("prompt_tokens", 0)
    if not isinstance(m, int) or m < 0:
        raise bad("`prompt_tokens` must be an integer >= 0")
    states: dict[int, list[tuple[Path, int]]] = {}
    for key, nodes in data["states"].items():
        if not isinstance(key, int) or not isinstance(nodes, list):
            raise bad(f"state {key!r}: states are integers mapping to lists of nodes")
        parsed = []
        for node in nodes:
            if isinstance(node, list) and node and isinstance(node[0], list):
                p, count = node[0], node[1] if len(node) > 1 else 0
            else:
                p, count = node, 0
            if not (isinstance(p, list) and all(isinstance(r, int) for r in p) and isinstance(count, int)):
                raise bad(f"state {key}: node {node!r} is not [path of ranks, prompt tokens]")
            if count > m:
                raise bad(f"state {key}: node {p} carries {count} prompt tokens, more than prompt_tokens={m}")
            parsed.append((tuple(p), count))
        if m and max((len(p) for p, _ in parsed), default=0) > key:
            raise bad(f"state {key}: candidates deeper than {key} (state k's tree is at most k deep)")
        states[key] = parsed
    if m and set(states) != set(range(1, m + 1)):
        raise bad(f"states {sorted(states)}: a tree with prompt_tokens={m} needs states 1..{m}")
    tf = TreeFile(states, m, **{k: data[k] for k in ("model", "hardware", "dtype", "built_by", "source",
                                                      "predicted_tau", "method") if data.get(k) is not None})
    tf.extra = {k: v for k, v in data.items() if k not in HEADER_FIELDS and k != "states"}
    for state in states:
        tf.tree(state)  # structural validation (parents first, ranks >= 0)
    return tf



# ------------------------------------------------------------------------------------------- --tree option



def locate(relative: str) -> FsPath | None:
    """A data file (trees/..., acceptance/...) in the working directory, else the one shipped with the repo."""
    return store.find(relative)


def auto_candidates(model: str, method: str, hardware: str, dtype: str) -> list[str]:
    """Where `--tree auto` looks, in order: this hardware's tree (specbench build-tree), then the method's
    shipped default for the dtype, then for any dtype."""
    stems = [] if method == "ppd" else [f"{method}-{hardware}-{dtype}", f"{method}-{hardware}"]
    stems += [f"{hardware}-{dtype}", hardware, f"{method}-{dtype}", method]
    return [str(store.tree_file(model, stem)) for stem in stems]


def find_auto_tree(model: str, method: str, hardware: str, dtype: str) -> tuple[TreeFile, str] | None:
    """The tree file `--tree auto` takes (auto_candidates, in order; the method and dtype must match), with where it
    came from, or None when there is none."""
    for rel in auto_candidates(model, method, hardware, dtype):
        path = locate(rel)
        if path is None:
            continue
        tf = read_tree_file(path)
        if tf.method == method and tf.dtype in ("any", dtype):
            return tf, str(path) + _borrowed(tf, hardware)
    return None


def other_trees(model: str, method: str, hardware: str, dtype: str) -> list[str]:
    """This method's tree files for this model that `--tree auto` does not take here (other hardware or dtype):
    the only trees a note about a missing tree should name."""
    own = f"{hardware}-{dtype}" if method == "ppd" else f"{method}-{hardware}-{dtype}"
    found = set()
    for root in store.roots():
        for path in sorted((root / store.tree_dir(model)).glob("*.yaml")):
            rel = str(store.tree_file(model, path.stem))
            if path.stem == own or re.fullmatch(re.escape(own) + r"-b\d+", path.stem):  # this one, per batch size
                continue
            try:
                head = yaml.safe_load(path.read_text()) or {}
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(head, dict) and head.get("method", "ppd") == method:
                found.add(rel)
    return sorted(found)


def resolve_tree(spec: str, model: str, method: str, hardware: str, dtype: str,
                 build: Callable[[int], TreeFile], default_size: int,
                 model_spec: str | None = None,
                 missing: Callable[[], tuple[TreeFile, str]] | None = None) -> tuple[TreeFile, str]:
    """--tree auto | PATH | size=N -> (tree file, where it came from). `build(n)` makes a tree of size n. `model` is
    the model's file-name key (trees/<model>/), `model_spec` the model as the user named it (for the advice).
    `missing()` answers `--tree auto` when this hardware has no tree file (the tree methods build one from this
    hardware's profile and the method's acceptance file, methods/tree/resolution.py); without it, a size
    `default_size` tree and a note naming the commands that make this hardware's. A PATH is read from the working
    directory, else from the checkout (a relative path a shipped recommendation records)."""
    if spec.startswith("size="):
        size = spec.removeprefix("size=")
        if not size.isdigit() or int(size) < 1:
            raise SpecbenchError(f"--tree {spec}: use size=N with N a positive integer")
        return build(int(size)), f"built, size {size}"
    if spec == "auto":
        found = find_auto_tree(model, method, hardware, dtype)
        if found is not None:
            return found
        if missing is not None:
            return missing()
        others = other_trees(model, method, hardware, dtype)
        seen = f"; {method} trees for other hardware or dtypes ({', '.join(others)}) are not used" if others else ""
        named = f" --model {model_spec}" if model_spec else ""
        flag = "" if method == "ppd" else f" --method {method}"
        return build(default_size), (f"built, size {default_size} (no {method} tree file for {model} on {hardware} "
                                     f"{dtype}{seen}: `specbench profile{named} --dtype {dtype}` then "
                                     f"`specbench build-tree{named}{flag} --gpu cpu --dtype {dtype}` makes "
                                     "this hardware's)")
    path = store.resolve_data_path(spec)  # trees/<model>/... is also found in the checkout from any directory
    if not FsPath(path).is_file():
        raise SpecbenchError(f"--tree {spec}: no such file; use auto, size=N or a trees/*.yaml path")
    tf = read_tree_file(path)
    return tf, spec + _borrowed(tf, hardware)


def _borrowed(tree: TreeFile, hardware: str) -> str:
    """A label for a tree chosen for other hardware than this one ('' when it is this hardware's)."""
    if tree.hardware in ("any", hardware):
        return ""
    return f" (built for {tree.hardware}, {tree.source}: borrowed, its predictions are not this hardware's)"

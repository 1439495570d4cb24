"""The trees/*.yaml file format (TreeFile: provenance plus one Tree per state, core/tree.py) and the `--tree`
option's parts every command shares: its value (TreeSpec, parsed once: methods/tree/batch_trees.tree_spec), where
`--tree auto` looks (find_auto_tree; the choice itself is planning/tree_choice.py), and a tree read or built for a
file or size (resolve_tree)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path as FsPath

import yaml

from ..errors import SpecbenchError
from ..families import tree_stem
from . import lookup, store
from .structured import read_structured
from .tree import Tree, TreePath

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

    states: dict[int, list[tuple[TreePath, int]]]
    prompt_tokens: int  # m: what the root carries; states are 1..m (a tree without prompt tokens: m = 0, state 0)
    model: str = ""
    hardware: str = "any"
    dtype: str = "any"
    built_by: str = ""
    source: str = "measured"  # measured | estimated (a tree from a hardware preset, not measured here)
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
    states: dict[int, list[tuple[TreePath, int]]] = {}
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
    own = [tree_stem(method, f"{hardware}-{dtype}"), tree_stem(method, hardware)]
    stems = list(dict.fromkeys(own + [f"{hardware}-{dtype}", hardware, f"{method}-{dtype}", method]))
    return [str(store.tree_file(model, stem)) for stem in stems]


def find_auto_tree(model: str, method: str, hardware: str, dtype: str) -> tuple[TreeFile, str] | None:
    """The tree file `--tree auto` takes (auto_candidates, in order; the method and dtype must match), with where it
    came from, or None when there is none. A tree built from a disturbed profile is skipped unless allowed
    (core/lookup.py); the one taken is recorded in the run's ledger."""
    for rel in auto_candidates(model, method, hardware, dtype):
        found = lookup.find(lookup.TREE, rel)
        if found is None:
            continue
        tf = read_tree_file(found.path)
        if tf.method == method and tf.dtype in ("any", dtype):
            lookup.use(found, f"{method} --tree auto")
            return tf, str(found.path) + _borrowed(tf, hardware)
    return None


def other_trees(model: str, method: str, hardware: str, dtype: str) -> list[str]:
    """This method's tree files for this model that `--tree auto` does not take here (other hardware or dtype):
    the only trees a note about a missing tree should name."""
    own = tree_stem(method, f"{hardware}-{dtype}")
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


@dataclass(frozen=True)
class TreeSpec:
    """The `--tree` value, parsed once: auto (this hardware's tree) | a trees/*.yaml PATH | size=N (searched now) |
    dynamic[=M] (EAGLE-2's tree drafted each step, M candidates; the static tree of that size
    serves prefill, predictions and the artefact check)."""

    kind: str  # "auto" | "path" | "size" | "dynamic"
    size: int | None = None  # size=N, dynamic=M
    path: str | None = None

    @classmethod
    def parse(cls, value) -> "TreeSpec":
        text = str(value if value is not None else "auto")
        if text in ("auto", "dynamic"):
            return cls(text)
        for kind, prefix, usage in (("size", "size=", "size=N with N a positive integer"),
                                    ("dynamic", "dynamic", "dynamic or dynamic=M with M a positive number of candidates")):
            if text.startswith(prefix):
                size = text.removeprefix(kind).removeprefix("=")
                if not text.startswith(kind + "=") or not size.isdigit() or int(size) < 1:
                    raise SpecbenchError(f"--tree {text}: use {usage}")
                return cls(kind, int(size))
        return cls("path", path=text)

    def __str__(self) -> str:
        if self.kind == "path":
            return str(self.path)
        return self.kind + ("" if self.size is None else f"={self.size}")


def resolve_tree(spec: TreeSpec, hardware: str, build: Callable[[int], TreeFile]) -> tuple[TreeFile, str]:
    """--tree size=N | PATH -> (tree file, where it came from); `build(n)` makes a tree of size n. A PATH is read from
    the working directory, else from the checkout (a relative path a shipped recommendation records). `--tree auto`
    is planning/tree_choice.choose's (find, build here, explain)."""
    if spec.kind == "size":
        return build(spec.size), f"built, size {spec.size}"
    if spec.kind != "path":
        raise SpecbenchError(f"--tree {spec}: not a tree file or a size (auto and dynamic are resolved by the tree method)")
    path = store.resolve_data_path(spec.path)  # trees/<model>/... is also found in the checkout from any directory
    if not FsPath(path).is_file():
        raise SpecbenchError(f"--tree {spec.path}: no such file; use auto, size=N or a trees/*.yaml path")
    tf = read_tree_file(path)
    lookup.note_used(lookup.TREE, path, f"--tree {spec}")
    return tf, spec.path + _borrowed(tf, hardware)


def _borrowed(tree: TreeFile, hardware: str) -> str:
    """A label for a tree chosen for other hardware than this one ('' when it is this hardware's)."""
    if tree.hardware in ("any", hardware):
        return ""
    return f" (built for {tree.hardware}, {tree.source}: borrowed, its predictions are not this hardware's)"

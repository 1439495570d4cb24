"""Text taken from the Python standard library, offline on any machine: the raw material of the training-only
sources `stdlib-code` (function and method stubs: signature + docstring) and `stdlib-docs` (documentation of classes
and modules, and the language reference topics of pydoc_data).

Deterministic: files in sorted order, first occurrence of a name kept, fixed seeds. Orders only ever grow at the end
(stubs: the module-level functions as they always were, then methods), so the first prompts of a source, which
trainers hold out, stay the same prompts.
"""

from __future__ import annotations

import ast
import copy
import random
import sysconfig
from functools import lru_cache
from pathlib import Path

SKIP_DIRS = {"site-packages", "dist-packages", "idlelib", "lib2to3", "turtledemo", "ensurepip"}


@lru_cache(maxsize=1)
def modules() -> tuple[tuple[str, ast.Module], ...]:
    """(dotted name, parsed tree) of every public stdlib module file, in sorted path order (parsed once)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(part.startswith(("_", "test", "config-")) or part in SKIP_DIRS for part in rel):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        out.append((".".join(rel)[:-3], tree))
    return tuple(out)


# ---------------------------------------------------------------------------------------------------- code

def stdlib_stubs(limit: int) -> list[str]:
    """Up to `limit` stubs: first the public module-level functions with a docstring (`def f(args):` + docstring,
    shuffled across modules, seed 0), then public methods (`class C:` + the method's stub, seed 1)."""
    functions: dict[str, str] = {}
    methods: dict[str, str] = {}
    for _, tree in modules():
        for node in tree.body:
            stub = _stub(node)
            if stub and node.name not in functions:
                functions[node.name] = stub
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                for sub in node.body:
                    stub = _stub(sub)
                    key = f"{node.name}.{getattr(sub, 'name', '')}"
                    if stub and key not in methods:
                        methods[key] = f"class {node.name}:\n" + "".join(
                            f"    {line}\n" if line else "\n" for line in stub.splitlines())
    first = sorted(functions)
    random.Random(0).shuffle(first)
    then = sorted(methods)
    random.Random(1).shuffle(then)
    return ([functions[name] for name in first] + [methods[key] for key in then])[:limit]


def _stub(node: ast.stmt) -> str | None:
    """A public function's signature and docstring as source (None if private, undocumented or odd-sized)."""
    if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
        return None
    doc = ast.get_docstring(node)
    if not doc or not 40 <= len(doc) <= 600:
        return None
    indented = "\n".join(("    " + line) if line else "" for line in doc.splitlines())
    head = copy.copy(node)  # the same def (every field this Python's ast has), decorators and body dropped
    head.decorator_list, head.body = [], [ast.Pass()]
    signature = ast.unparse(head).rsplit("\n", 1)[0]  # drop the placeholder body
    return f'{signature}\n    """{indented.lstrip()}\n    """\n'


# ---------------------------------------------------------------------------------------------------- docs

def stdlib_docs() -> list[tuple[str, str, str]]:
    """(kind, name, text) of every documentation text the `stdlib-docs` source asks about, in a fixed order:
    class docstrings (80-1500 characters), module docstrings (300-4000) and pydoc_data's language reference topics
    (500-6000), shuffled together (seed 2)."""
    docs: dict[str, tuple[str, str, str]] = {}
    for module, tree in modules():
        text = ast.get_docstring(tree)
        if text and 300 <= len(text) <= 4000:
            docs.setdefault(f"module {module}", ("module", module, text))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                text = ast.get_docstring(node)
                if text and 80 <= len(text) <= 1500:
                    docs.setdefault(f"class {node.name}", ("class", f"{module}.{node.name}", text))
    for topic, text in sorted(_pydoc_topics().items()):
        if 500 <= len(text) <= 6000:
            docs.setdefault(f"topic {topic}", ("language topic", topic, text.strip()))
    order = sorted(docs)
    random.Random(2).shuffle(order)
    return [docs[key] for key in order]


def _pydoc_topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions leave pydoc_data out
        return {}
    return dict(topics)

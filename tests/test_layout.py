"""The package layout: imports flow one way, cli -> ci -> report -> backends -> run -> methods -> planning -> train ->
artefacts -> data -> core -> families, with one exception (UPWARD). A method family's folder (methods/<family>/)
keeps its parts together and they sit in the layer of their role: the artefact (artifact.py, sd's drafter.py, Hidden Transfer's layers.py) below training (training.py)
below planning, which scores artefacts, below the method itself (its guesser or step)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "specbench"
# lower number = lower layer; a module may import its own layer or lower ones, never a higher one
# families: the torch-free family declarations, read by every layer above; they import only errors
LAYERS = {"errors": 0, "progress": 0, "__init__": 0, "families": 0.5, "core": 1, "data": 2, "train": 4,
          "planning": 5, "methods": 6, "run": 7, "backends": 8, "report": 9, "ci": 10, "cli": 11, "__main__": 12}
# Imports allowed to run up the layers, each with its reason; none now: `--engine` backends (backends/) are named
# to run/ by module in run/backend.BACKENDS and loaded when a run asks for one.
UPWARD: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every specbench module `path` imports, at module level or inside functions."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("specbench"):
                for alias in node.names:  # `from pkg import module` imports the module
                    sub = f"{target}.{alias.name}"
                    found.add(sub if (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists() else target)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("specbench")}
    found.discard(name)
    return found


ARTEFACTS, TRAIN = 3, 4
# a module of a method family's folder -> its layer, by its role (the file name); the rest of methods/ is layer 6
FAMILY_ROLES = {"artifact": ARTEFACTS, "drafter": ARTEFACTS, "layers": ARTEFACTS, "released": ARTEFACTS,
                "training": TRAIN}


def layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 4 and parts[1] == "methods" and parts[3] in FAMILY_ROLES:
        return FAMILY_ROLES[parts[3]]
    return LAYERS[parts[1] if len(parts) > 1 else "__init__"]


def test_every_top_level_entry_has_a_layer():
    for entry in PACKAGE.iterdir():
        if entry.name.startswith((".", "__pycache__")) or entry.suffix not in (".py", ""):
            continue
        if entry.is_dir() and not any(entry.rglob("*.py")):  # a folder left with only __pycache__ by a move
            continue
        assert entry.stem in LAYERS, f"{entry} is in no layer: add it to LAYERS (and docs/code-layout.md)"


def test_imports_flow_one_way():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        me = module_name(path)
        for other in imports(path):
            if layer(other) > layer(me) and (me, other) not in UPWARD:
                wrong.append(f"{me} imports {other}")
    assert not wrong, "imports against the layer order:\n" + "\n".join(sorted(wrong))


def test_the_upward_exception_is_still_needed():
    """UPWARD names imports that exist and run up the layers: one made unnecessary is removed from the table."""
    for me, other in UPWARD:
        path = PACKAGE.parent / (me.replace(".", "/") + ".py")
        assert other in imports(path) and layer(other) > layer(me), f"{me} -> {other} is no longer an exception"


def test_no_import_cycles():
    graph = {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_every_benchmark_script_imports():
    """benchmarks/*.py import what the package has (ar_vs_hf_generate.py went on importing a class removed from
    specbench.methods, unnoticed until it was wanted on a GPU): each loads as a module (their work runs under
    `if __name__ == "__main__"`)."""
    import importlib.util

    scripts = sorted((PACKAGE.parent / "benchmarks").glob("*.py"))
    assert scripts
    for script in scripts:
        spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_the_code_layout_page_states_these_rules():
    """docs/code-layout.md's layer order line, its family roles and its upward exception say what LAYERS,
    FAMILY_ROLES and UPWARD enforce, so the page cannot drift from the rules."""
    import re

    page = (PACKAGE.parent / "docs" / "code-layout.md").read_text()
    said = re.search(r"^Layer order: `([^`]+)`", page, re.M)
    assert said, "docs/code-layout.md has no 'Layer order: `...`' line"
    order = [name.strip() for name in said.group(1).split("->")]
    folders = sorted((name for name in LAYERS if (PACKAGE / name).is_dir()), key=lambda n: -LAYERS[n])
    assert order == folders, f"the page says {order}, LAYERS says {folders}"
    roles = {"artifact": ARTEFACTS, "training": TRAIN}  # the roles the page names a layer for
    assert all(FAMILY_ROLES[r] == layer for r, layer in roles.items())
    assert LAYERS["data"] < ARTEFACTS < TRAIN == LAYERS["train"], "the page puts the artefact between data and train"
    for role in FAMILY_ROLES:
        assert f"`{role}.py`" in page, f"the page does not name the family role {role}.py"
    for me, other in UPWARD:
        assert f"`{me.removeprefix('specbench.')} -> {other.removeprefix('specbench.')}`" in page
    assert ("runs up the layers" in page) == bool(UPWARD), "the page states an upward import exactly when there is one"


def test_the_core_layer_names_no_method_and_asks_no_model_what_it_is():
    """A drafter module reaches the engines through core/batch/decoder.DraftModule: nothing in core/ looks for a
    transformers decoder by name or names a method family's module."""
    offenders = []
    for path in (PACKAGE / "core").rglob("*.py"):
        text = path.read_text()
        if "get_decoder" in text or "methods." in "".join(sorted(imports(path))):
            offenders.append(str(path.relative_to(PACKAGE)))
    assert not offenders, "core modules that ask for a decoder by name or import a method: " + ", ".join(offenders)

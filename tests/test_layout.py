"""The package layout: imports flow one way, cli -> ci -> report -> backends -> run -> methods -> planning -> train ->
artefacts -> data -> core -> families, with no exception now (UPWARD would list one, with its reason), and no
cycles. A method family's folder (methods/<family>/) keeps its parts together and they sit in the layer of their
role: the artefact (artifact.py, sd's drafter.py, Hidden Transfer's layers.py) below training (training.py) below
planning, which scores artefacts, below the method itself (its guesser or step). docs/code-layout.md states these
rules and the glossary of four words (engine, plan, step, check) that GLOSSARY holds the names to."""

from __future__ import annotations

import ast
import re
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
    """benchmarks/*.py import what the package has (a script can go on importing a name the package no longer
    has, unnoticed until it is wanted on a GPU): each loads as a module (their work runs under
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


# One meaning per name (docs/code-layout.md, "Names"): where a class, function or module named with the word may live.
# engine: a batch engine (core/batch/); what `--engine` picks is a backend.
# plan: `specbench plan`'s answer.
# step: a decode step; training counts updates (train/ and a family's training.py name no step).
# check: the act of checking; what it finds is an outcome, so no class is named a check.
GLOSSARY = {"engine": ("core/batch/",), "plan": ("planning/plan.py", "planning/chain_plan.py", "cli/plan.py")}
NO_STEP = ("train/", "training.py")
FORMS = {"engine": {"engine", "engines"}, "plan": {"plan", "plans", "planned"}, "step": {"step", "steps"},
         "check": {"check", "checks"}}


def words(name: str) -> set[str]:
    """The lower-case words of a snake_case or CamelCase name."""
    return {w.lower() for part in name.split("_") for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", part)}


def named(where: str, source: str) -> list[tuple[str, str]]:
    """(kind, name) of the module at `where` (its folders included) and every class and function `source` defines."""
    out = [("module", part) for part in Path(where).with_suffix("").parts]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(("class" if isinstance(node, ast.ClassDef) else "function", node.name))
    return out


def misnamed(where: str, source: str) -> list[str]:
    """The names of the module at `where` (relative to specbench/) that use a glossary word away from its meaning."""
    wrong = []
    for kind, name in named(where, source):
        said = words(name)
        for word, places in GLOSSARY.items():
            if said & FORMS[word] and not where.startswith(places) and not where.endswith(places):
                wrong.append(f"{where}: {kind} {name} ({word}: only in {', '.join(places)})")
        if said & FORMS["step"] and (where.startswith(NO_STEP[0]) or where.endswith(NO_STEP[1])):
            wrong.append(f"{where}: {kind} {name} (training counts updates, not steps)")
        if kind == "class" and said & FORMS["check"]:
            wrong.append(f"{where}: class {name} (a check finds an outcome: name the class for it)")
    return wrong


def test_names_keep_the_glossary():
    wrong = [w for path in sorted(PACKAGE.rglob("*.py"))
             for w in misnamed(path.relative_to(PACKAGE).as_posix(), path.read_text())]
    assert not wrong, "names used away from their one meaning (docs/code-layout.md, Names):\n" + "\n".join(wrong)


def test_the_glossary_check_finds_a_stray_name():
    """misnamed() flags each kind of stray name, so the test above can fail."""
    assert words("BatchEngine") == {"batch", "engine"} and words("first_plan") == {"first", "plan"}
    assert words("explain") == {"explain"} and words("LosslessCheck") == {"lossless", "check"}
    strays = {"run/x.py": "class ShardPlan: ...", "methods/y.py": "def engine_turn(): ...",
              "train/z.py": "def step_loss(): ...", "methods/ppd/training.py": "def step_seconds(): ...",
              "data/w.py": "class DisjointCheck: ...", "report/engines.py": "", "methods/tree/plan.py": ""}
    for where, source in strays.items():
        assert misnamed(where, source), f"{where}: {source or 'the module'} was not flagged"
    assert not misnamed("core/batch/engine.py", "class BatchEngine: ...")
    assert not misnamed("planning/plan.py", "class MethodPlan: ...\ndef plan(): ...")
    assert not misnamed("methods/batch_loop.py", "def decode_step(): ...")


def test_the_code_layout_page_has_the_glossary():
    page = (PACKAGE.parent / "docs" / "code-layout.md").read_text()
    for word in FORMS:
        assert re.search(rf"^\| \*\*{word}\*\* \|", page, re.M), f"docs/code-layout.md's Names table has no {word}"


def test_the_families_import_nothing_but_errors():
    """The family declarations stay torch-free below the core (docs/code-layout.md: they import nothing but
    `errors`), so `--help`, planning and the store read them."""
    wrong = [f"{module_name(p)} imports {other}" for p in (PACKAGE / "families").glob("*.py") for other in imports(p)
             if other != "specbench.errors" and not other.startswith("specbench.families")]
    assert not wrong, "\n".join(wrong)


# what edits a transformers KV cache: only core/batch/cache.py names it (docs/code-layout.md, core/batch/)
CACHE_EDITS = {"DynamicCache", "DynamicLayer", "StaticCache", "crop", "batch_select_indices", "reorder_cache",
               "batch_repeat_interleave"}


def test_only_cache_py_edits_transformers_caches():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "core" / "batch" / "cache.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                found = {a.name for a in node.names}
            else:
                found = {getattr(node, "attr", None), getattr(node, "id", None)}
            for hit in found & CACHE_EDITS:
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {hit}")
    assert not offenders, "transformers' caches edited outside core/batch/cache.py:\n" + "\n".join(offenders)

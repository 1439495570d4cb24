"""Comments and docstrings under specbench/ give shapes and reasons: every module path they name exists (a file of
another project is named in OUTSIDE), and none cites an issue number or a library version (RESULTS files and docs
keep measurements and versions, the tracker keeps issue numbers)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specbench"
# every file and folder a comment may name, relative to the repository (a module also without its `.py`)
FILES = [p.relative_to(ROOT) for folder in ("specbench", "tests", "benchmarks") for p in (ROOT / folder).rglob("*")
         if "__pycache__" not in p.parts]
PATHS = {str(p) for p in FILES} | {str(p.with_suffix("")) for p in FILES if p.suffix == ".py"}
# files of other projects that comments cite (the authors' repositories, servers, llama.cpp's converter)
OUTSIDE = {"convert_hf_to_gguf.py", "tokenizer_manager.py", "eagle/model/cnets.py", "eagle/model/cnets1.py",
           "eagle/model/modeling_llama_kv.py", "eagle/traineagle3/cnets.py", "traineagle3/main.py",
           "medusa/model/medusa_model.py", "vllm/v1/spec_decode/metrics.py", "vllm/benchmarks/serve.py"}
PY_PATH = re.compile(r"(?<![\w/.*-])((?:[A-Za-z_]\w*/)*[A-Za-z_]\w*\.py)\b")
# a path into the package without `.py` (`core/tree_file.TreeSpec`, `methods/eagle/`): one of the package's folders,
# then modules or folders (a glob such as `report/map_*.py` is left alone)
PACKAGE_PATH = re.compile(r"(?<![\w/.-])(specbench(?:/[A-Za-z_]\w*)+"
                          r"|(?:ci|cli|report|backends|run|methods|planning|train|data|core|families)(?:/[A-Za-z_]\w*)+)"
                          r"(?![\w*]|\.py)")
ISSUE = re.compile(r"\bissues? #?\d+|(?<![\w&#])#\d{1,4}\b", re.I)
LIBRARIES = r"torch|pytorch|transformers|accelerate|vllm|sglang|llama-cpp-python|llama\.cpp|numpy|pandas|triton|cuda"
VERSION = re.compile(rf"\b(?:{LIBRARIES})\b\W{{0,4}}(?:>=?\s*|v)?\d+\.(?:\d+|x)\b", re.I)


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in `path` (a docstring: a string standing as a statement)."""
    text = path.read_text()
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out += [(node.lineno + i, line) for i, line in enumerate(node.value.value.splitlines())]
    return out


def exists(ref: str) -> bool:
    """`ref` names a file or folder of this repository: a path under specbench/, tests/ or benchmarks/ ends with it
    (`step.py`, `tree/step.py` and `methods/tree/step.py` all name methods/tree/step.py; `core/tree_file` names
    core/tree_file.py)."""
    ref = ref.removesuffix("/")
    return any(p == ref or p.endswith("/" + ref) for p in PATHS)


def named_modules(text: str) -> list[str]:
    """The module paths a comment names."""
    return PY_PATH.findall(text) + PACKAGE_PATH.findall(text)


def test_comments_name_only_modules_that_exist():
    missing = [f"{path.relative_to(ROOT)}:{line}: {ref}" for path in sources() for line, text in prose(path)
               for ref in named_modules(text) if ref not in OUTSIDE and not exists(ref)]
    assert not missing, "comments or docstrings name modules that do not exist:\n" + "\n".join(missing)


def test_no_issue_numbers_in_the_package():
    """The code says why, not which ticket: no `issue 12` or `#12` anywhere under specbench/ (strings included)."""
    found = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}" for path in sources()
             for i, line in enumerate(path.read_text().splitlines(), start=1) if ISSUE.search(line)]
    assert not found, "issue numbers under specbench/:\n" + "\n".join(found)


def test_no_library_versions_in_comments():
    """A comment naming a library's version goes stale with the next install: run.yaml's environment and the
    RESULTS files record versions."""
    found = [f"{path.relative_to(ROOT)}:{line}: {text.strip()}" for path in sources()
             for line, text in prose(path) if VERSION.search(text)]
    assert not found, "library versions in comments or docstrings:\n" + "\n".join(found)


def test_the_checks_catch_what_they_look_for():
    """Each pattern finds what it is for, so a check that could never fail proves nothing."""
    assert ISSUE.search("see issue 49") and ISSUE.search("(#12)") and not ISSUE.search('COLORS = "#777777"')
    assert VERSION.search("transformers >= 5.x: tp_plan") and VERSION.search("torch 2.13 CPU kernels")
    assert not VERSION.search("torch's CPU kernels") and not VERSION.search("library versions, git")
    assert named_modules("(drafting.py, batch.py; core/tree_file.TreeSpec, report/map_*.py)") == [
        "drafting.py", "batch.py", "core/tree_file"]
    assert named_modules("(specbench/engines/)") == ["specbench/engines"]
    assert exists("drafting.py") and exists("tree/step.py") and exists("core/tree_file") and exists("methods/eagle/")
    assert not exists("batch.py") and not exists("engines/llama_cpp") and not exists("methods/tree/plan.py")

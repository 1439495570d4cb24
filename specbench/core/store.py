"""Where specbench keeps its files: the one module that spells out the folders of measured profiles, trees,
acceptance tables, trained artefacts, dataset specs and the user cache, and the files inside a run folder (RunFolder).

Relative paths (`profile_file(...)`, `tree_file(...)`, ...) name a file inside a data root. Commands file what they
make under `write_root()`: the working directory, or the user cache when the working directory lies in a source
checkout of specbench (tracked profiles/, trees/, recommendations/ are never overwritten unasked); `--out` writes
elsewhere. `find(...)` looks a relative path up in `sources()` order: the working directory (what the user made
here), the user cache (what commands filed from a checkout), then the checkout the package runs from (what ships).
Which of those a run may use (a profile measured on a disturbed machine is skipped) is core/lookup.py's.
Model keys are `core/model/naming.model_slug(spec)` ("smollm2-135m", "org--name"), hardware keys
`core/machine/hardware.hardware_slug(device)`; this module takes them as strings, so every layer can use it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .. import REPO_ROOT

PROFILES, TREES, ACCEPTANCE, ARTIFACTS, DATASETS = "profiles", "trees", "acceptance", "artifacts", "datasets"
RECOMMENDATIONS = "recommendations"


def checkout() -> Path:
    """The checkout the package runs from: shipped data lives here, and its git revision is recorded."""
    return REPO_ROOT


WORKING_DIRECTORY, USER_CACHE, SHIPPED = "working directory", "user cache", "shipped"


def sources() -> list[tuple[str, Path]]:
    """Where lookups search, in order, each with its name: the working directory, the user cache, the checkout
    (shipped data). A working directory that is the checkout itself (a command run inside it) is the shipped data,
    searched last: what a command measured here is filed in the user cache (write_root), and must be read before
    the shipped files it was measured to replace."""
    out, seen = [], set()
    shipped = _resolved(checkout())
    for name, root in ((WORKING_DIRECTORY, Path.cwd()), (USER_CACHE, user_cache()), (SHIPPED, checkout())):
        key = _resolved(root)
        if key == shipped and name != SHIPPED:  # the checkout as working directory: its turn comes last
            continue
        if key not in seen:
            seen.add(key)
            out.append((name, root))
    return out


def roots() -> tuple[Path, ...]:
    """Where lookups search, in order: the working directory, the user cache, then the checkout (shipped data)."""
    return tuple(root for _, root in sources())


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path


def source_of(path: str | Path) -> str:
    """Which source a data file lies in: shipped (the checkout), user cache, working directory; "given path" for a
    file outside all three (an explicit --tree PATH or --gpu PATH elsewhere)."""
    for name, root in ((SHIPPED, checkout()), (USER_CACHE, user_cache()), (WORKING_DIRECTORY, Path.cwd())):
        if _below(path, root) is not None:
            return name
    return "given path"


def is_source_checkout(folder: Path) -> bool:
    """Whether `folder` lies inside a git checkout of specbench itself (a folder holding .git and the specbench
    package): its profiles/, trees/, acceptance/ and recommendations/ are tracked files."""
    folder = _resolved(folder)
    for place in (folder, *folder.parents):
        if (place / ".git").exists():  # the nearest checkout holding the folder: specbench's or another project's
            return (place / "specbench" / "__init__.py").is_file()
    return False


def write_root() -> tuple[Path, str]:
    """(the root commands file profiles, trees, acceptance files and recommendations under, its source name): the
    working directory, or the user cache when the working directory is a source checkout of specbench."""
    if is_source_checkout(Path.cwd()):
        return user_cache(), USER_CACHE
    return Path("."), WORKING_DIRECTORY


def filed(relative: str | Path) -> Path:
    """Where a command files `relative` (profiles/..., trees/...) when not given --out: under write_root(); a path
    relative to the working directory when that is the root."""
    root, _ = write_root()
    return Path(relative) if root == Path(".") else root / relative


def said_where(path: str | Path) -> str:
    """A written file as commands report it: its path and source, and why the user cache when it is there."""
    source = source_of(path)
    why = " (the working directory is a source checkout of specbench; --out PATH writes elsewhere)" \
        if source == USER_CACHE and is_source_checkout(Path.cwd()) else ""
    return f"{relative_to_cwd(path)} ({source}{why})"


def find(relative: str | Path) -> Path | None:
    """A data file in the working directory, else the one shipped with the repo, else None."""
    for root in roots():
        if (root / relative).is_file():
            return root / relative
    return None


def _below(path: str | Path, root: Path) -> str | None:
    """`path` relative to `root` (POSIX separators) when it lies below it, else None."""
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError):
        return None


def relative_to_cwd(path: str | Path) -> str:
    """`path` relative to the working directory when it lies below it (POSIX separators), else as given: what files
    meant to be shipped or linked record, rather than the absolute path of one checkout."""
    rel = _below(path, Path.cwd())
    return Path(path).as_posix() if rel is None else rel


def data_relative(path: str | Path) -> str:
    """`path` relative to the first root (working directory, then checkout) it lies below, as `find` takes it back
    (trees/<model>/....yaml), else as given: what a file meant to be shipped records instead of one checkout's
    absolute path."""
    for root in roots():
        rel = _below(path, root)
        if rel is not None:
            return rel
    return Path(path).as_posix()


def resolve_data_path(recorded: str) -> str:
    """A path a shipped file recorded (data_relative): as given when it exists from here, else found in the working
    directory or the checkout; as given when neither has it (the caller's missing-file error names it)."""
    if Path(recorded).exists():
        return recorded
    found = find(recorded)
    return str(found) if found is not None else recorded


# ------------------------------------------------------------------------------------- relative paths by kind


def label_slug(text: str) -> str:
    """A placement label as a file-name part ('map:0:16,1:14' -> 'map-0x16-1x14')."""
    if text.startswith("map:"):
        return "map-" + "-".join(part.replace(":", "x") for part in text[4:].split(","))
    return text.replace(":", "-")


def profile_name(model: str, dtype: str, placement: str = "") -> str:
    """<model>-<dtype>.yaml: a profile's file name inside its hardware's folder; a model spread over devices
    (core/model/placement.label, not "single:...") adds @<placement>, since L(n) changes with the placement."""
    if placement and not placement.startswith("single:"):
        return f"{model}-{dtype}@{label_slug(placement)}.yaml"
    return f"{model}-{dtype}.yaml"


def profile_file(hardware: str, model: str, dtype: str, placement: str = "") -> Path:
    """profiles/<hardware>/<model>-<dtype>[@<placement>].yaml: a measured latency curve L_fp(n) (`profile`)."""
    return Path(PROFILES) / hardware / profile_name(model, dtype, placement)


def profiles_dir() -> Path:
    """profiles/: the root `specbench profile` files curves under (per hardware key)."""
    return Path(PROFILES)


def tree_dir(model: str) -> Path:
    """trees/<model>/: the trees of one model, every method and hardware."""
    return Path(TREES) / model.replace("/", "--")


def tree_file(model: str, stem: str) -> Path:
    """trees/<model>/<stem>.yaml (stem: the family's prefix and `<hardware>-<dtype>`: families.tree_stem)."""
    return tree_dir(model) / f"{stem}.yaml"


def batch_stem(stem: str, batch_size: int = 1) -> str:
    """A tree file's stem for batch size B: `<stem>` at B = 1, `<stem>-b<B>` above (a tree chosen from L(B, w);
    it never overwrites batch 1's file)."""
    return stem if batch_size == 1 else f"{stem}-b{batch_size}"


def acceptance_file(model: str, family: str) -> Path:
    """acceptance/<model>/<family>.yaml: per-rank accuracy of a method's guesses (`specbench estimate`)."""
    return Path(ACCEPTANCE) / model / f"{family}.yaml"


def recommendation_file(model: str, hardware: str) -> Path:
    """recommendations/<model>/<hardware>.yaml: what `specbench recommend` chose here (`run --method auto` reads it)."""
    return Path(RECOMMENDATIONS) / model / f"{hardware}.yaml"


def artifact_dir(model: str, folder: str) -> Path:
    """artifacts/<model>/<folder>/: a trained artefact (`specbench train ...` writes it here)."""
    return Path(ARTIFACTS) / model / folder


def find_artifact_dir(model: str, folder: str, meta_file: str) -> Path:
    """The artefact folder in the working directory when it holds an artefact (its meta file), else the repo's
    (which may not exist: the caller says what to train)."""
    rel = artifact_dir(model, folder)
    return rel if (rel / meta_file).is_file() else checkout() / rel


def shipped_artifacts() -> Path:
    """The checkout's artifacts/ folder (artefacts that ship with specbench)."""
    return checkout() / ARTIFACTS


def dataset_specs() -> Path:
    """datasets/: the YAML specs of the benchmark sets (shipped)."""
    return checkout() / DATASETS


@dataclass(frozen=True)
class RunFolder:
    """The files of one run folder (`specbench run --out`, a shard, a merged run): the one place their names are
    spelled. Paths only: reading and writing them stays with run/ and report/."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @property
    def meta(self) -> Path:
        """run.yaml: settings, environment, model, trees, shard, `complete` (written first, so it marks a run)."""
        return self.path / "run.yaml"

    @property
    def records(self) -> Path:
        """records.csv: one row per generated turn (run/results.RecordWriter)."""
        return self.path / "records.csv"

    @property
    def tokens(self) -> Path:
        """tokens.jsonl: the token ids of each record."""
        return self.path / "tokens.jsonl"

    @property
    def timeline(self) -> Path:
        """timeline.jsonl: sd / pearl runs' per-step draft and target busy spans."""
        return self.path / "timeline.jsonl"

    @property
    def summary(self) -> Path:
        """summary.csv: one row per method x dataset (report/run_report.py)."""
        return self.path / "summary.csv"

    @property
    def report(self) -> Path:
        """report.md."""
        return self.path / "report.md"

    @property
    def merge(self) -> Path:
        """merge.yaml: the top folder of a merge over several hardware keys (one merged run below it per key)."""
        return self.path / "merge.yaml"

    @property
    def plots(self) -> tuple[Path, Path, Path]:
        """speedup.png, tokens_per_s.png and tau.png (report/plots.write_plots)."""
        return self.path / "speedup.png", self.path / "tokens_per_s.png", self.path / "tau.png"

    def is_run(self) -> bool:
        """The folder holds a run (its run.yaml)."""
        return self.meta.exists()


def user_cache() -> Path:
    """Where specbench keeps downloaded and converted files ($SPECBENCH_CACHE, default ~/.cache/specbench)."""
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench"))


def read_cached_json(name: str) -> dict:
    """A JSON object kept in the user cache (a history a command adds to), {} where it is missing or unreadable."""
    try:
        data = json.loads((user_cache() / name).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cached_json(name: str, data: dict, indent: int | None = None) -> bool:
    """Keep `data` as the user cache's JSON `name`; False where the cache cannot be written (best effort)."""
    try:
        path = user_cache() / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=indent))
    except OSError:
        return False
    return True

"""`run --tp 2` with two gloo ranks on CPU (torchrun, random:tiny; tests/tp_worker.py is one rank): the ranks take
every decision that changes their work together (rank 0's), so an interrupted and resumed run, or one whose ranks
see different noise, decodes the tokens of a plain run; the other rank is this run's sibling, not foreign load."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("tp_worker.py")
LIMIT_S = 240  # a desynchronised pair hangs in a collective: the launch is stopped and the test fails


def torchrun(out: Path, *args) -> dict[int, dict]:
    """Launch the two ranks; returns what each saw (tp_worker.py writes it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_port()),
           str(WORKER), *map(str, args), "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher's own session: its ranks and nothing else
        output, _ = proc.communicate()
        pytest.fail(f"the ranks did not finish in {LIMIT_S} s (a collective waiting on a rank that went "
                    f"elsewhere?):\n{output[-4000:]}")
    assert proc.returncode == 0, output[-4000:]
    return {r: json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in (0, 1)}


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tokens(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "tokens.jsonl").read_text().splitlines()]
    return {(r["method"], r["dataset"], str(r["prompt_id"]), r["turn"]): r["tokens"] for r in rows}


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp") / "mine.jsonl"
    rows = [{"prompt": "def add(a, b): return a + b\n" * 3}, {"turns": ["hello there", "and again hello there"]},
            {"question": "what is 12 + 30?"}, {"prompt": "abc abc abc abd"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def whole(prompts):
    """The run in one go: what the others must decode."""
    out = prompts.parent / "whole"
    seen = torchrun(out, "run", "--data", prompts)
    assert seen[0]["ended"] == seen[1]["ended"] == "complete", seen
    return out, seen


def test_an_interrupted_tensor_parallel_run_resumes_to_the_same_tokens(prompts, whole):
    out = prompts.parent / "resumed"
    first = torchrun(out, "run", "--data", prompts, "--stop-after", 2)
    assert first[0]["ended"] == first[1]["ended"] == "interrupted", first
    kept = pd.read_csv(out / "records.csv", dtype=str)
    assert sorted(kept.prompt_id.unique()) == ["0", "1"]  # two whole prompts kept, two to go
    second = torchrun(out, "run", "--data", prompts, "--resume")
    assert second[0]["ended"] == second[1]["ended"] == "complete", second
    assert tokens(out) == tokens(whole[0])
    assert len(pd.read_csv(out / "records.csv")) == len(pd.read_csv(whole[0] / "records.csv"))


def test_ranks_that_see_different_noise_retime_together(prompts, whole):
    """Rank 1's /proc says every turn was disturbed and rank 0's does not: rank 0's reading decides for both
    whether a turn is timed again (a rank re-timing alone would wait in a collective for ever)."""
    out = prompts.parent / "noisy"
    seen = torchrun(out, "run", "--data", prompts, "--busy-rank", 1, "--retime", 1)
    assert seen[0]["ended"] == seen[1]["ended"] == "complete", seen
    assert seen[0]["tries"] == seen[1]["tries"]  # every turn timed as often on both ranks
    assert tokens(out) == tokens(whole[0])


def test_the_other_rank_is_a_sibling_not_foreign_load(whole):
    out, seen = whole
    assert seen[1]["pid"] in seen[0]["siblings"] and seen[0]["pid"] in seen[1]["siblings"]
    assert "sibling_cpu" in pd.read_csv(out / "records.csv").columns


def test_rank_zero_decides_and_a_difference_is_refused_on_every_rank(tmp_path):
    seen = torchrun(tmp_path / "units", "units")
    for me in (0, 1):
        assert seen[me]["value"] == {"rank": 0}  # rank 0's value on both ranks
        assert "rank 0 refuses" in seen[me]["refusal"]
        assert seen[me]["draft_ms"] == 1.0  # rank 0's drafting time builds both ranks' trees
        said = seen[me]["differ"]
        assert "the trees" in said and "rank 1" in said and "tree-0" in said and "tree-1" in said

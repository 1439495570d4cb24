"""core/store.RunFolder: the one place the files of a run folder are named."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from specbench.core.store import RunFolder


def test_run_folder_names_the_files_a_run_writes(tmp_path):
    folder = RunFolder(str(tmp_path))  # a string is taken as a path
    assert folder.path == tmp_path
    assert folder.meta == tmp_path / "run.yaml"
    assert folder.records == tmp_path / "records.csv"
    assert folder.tokens == tmp_path / "tokens.jsonl"
    assert folder.timeline == tmp_path / "timeline.jsonl"
    assert folder.summary == tmp_path / "summary.csv"
    assert folder.report == tmp_path / "report.md"
    assert folder.merge == tmp_path / "merge.yaml"
    assert [p.name for p in folder.plots] == ["speedup.png", "tokens_per_s.png", "tau.png"]
    assert all(p.parent == tmp_path for p in folder.plots)


def test_run_folder_is_a_run_once_it_has_run_yaml(tmp_path):
    folder = RunFolder(tmp_path / "run")
    assert not folder.is_run()
    folder.path.mkdir()
    folder.records.write_text("method\n")
    assert not folder.is_run()  # records alone: not a run folder
    folder.meta.write_text("complete: false\n")
    assert folder.is_run()


def test_run_folder_is_frozen_and_compares_by_path(tmp_path):
    folder = RunFolder(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        folder.path = Path("elsewhere")  # type: ignore[misc]
    assert folder == RunFolder(str(tmp_path)) and len({folder, RunFolder(tmp_path)}) == 1

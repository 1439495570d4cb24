"""One CLI language: one name per idea (old spellings hidden but working), help that shows every default and a real
metavar, commands in workflow order, help without torch, and one error style naming the option and its value."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pandas as pd
import pytest
import typer
from rich.text import Text
from typer.testing import CliRunner

from specbench.cli import app
from specbench.cli.app import WORKFLOW
from specbench.cli.command import RENAMED
from specbench.cli.parse import ALL_PROMPTS, prompt_limit
from specbench.errors import SpecbenchError, did_you_mean
from specbench.run.runner import Runner

cli = CliRunner()
WIDE = {"COLUMNS": "400"}  # help on one line per option, so that phrases are not wrapped apart
TINY = ["--model", "random:tiny", "--max-new-tokens", "24", "--warmup", "0"]


def invoke(*args, **kwargs):
    return cli.invoke(app, [str(a) for a in args], **kwargs)


def said(result) -> str:
    return " ".join(result.output.split())  # rich wraps long lines


def commands():
    """(path, click command) of every command, groups walked."""
    root = typer.main.get_command(app)

    def walk(group, path):
        ctx = group.make_context(path[-1] if path else "specbench", [], resilient_parsing=True)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if hasattr(command, "list_commands"):
                yield from walk(command, path + [name])
            else:
                yield path + [name], command, command.make_context(name, [], resilient_parsing=True)

    return list(walk(root, []))


# ------------------------------------------------------------------------------------------------ help, no torch

HEAVY = ("torch", "transformers", "pandas", "matplotlib", "specbench.methods")


def _modules_after(args: list[str], env: dict | None = None) -> set[str]:
    """The heavy modules loaded by `specbench ARGS` in a fresh interpreter."""
    code = ("import sys\nsys.argv = ['specbench', *sys.argv[1:]]\nfrom specbench.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            f"print('MODULES', ' '.join(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m in {HEAVY!r}))")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)
    line = next(line for line in done.stdout.splitlines() if line.startswith("MODULES"))
    return set(line.split()[1:])


def test_root_help_imports_no_torch():
    loaded = _modules_after(["--help"])
    assert not loaded & {"torch", "transformers", "pandas", "matplotlib", "specbench.methods"}, loaded


def test_run_help_reads_the_method_options_from_the_cache_without_torch(tmp_path, monkeypatch):
    from specbench.cli import method_flags

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    for _ in range(3):  # a source file edited meanwhile (a shared checkout) rightly rebuilds it: then try again
        method_flags.catalogue()  # files the catalogue, as the first `run --help` would
        key = method_flags._sources_key()
        loaded = _modules_after(["run", "--help"], {"SPECBENCH_CACHE": str(tmp_path / "cache")})
        if "torch" not in loaded or method_flags._sources_key() == key:
            break
    assert (tmp_path / "cache" / "cli" / "method-options.json").exists()
    assert "torch" not in loaded


def test_the_cached_catalogue_is_the_registry(tmp_path, monkeypatch):
    from specbench.cli import method_flags

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    assert method_flags.catalogue() == method_flags.from_registry()  # built
    cached = json.loads((tmp_path / "cli" / "method-options.json").read_text())
    assert cached["options"] == method_flags.from_registry()
    monkeypatch.setattr(method_flags, "_sources_key", lambda: "another")  # a source file changed: rebuilt
    cached["options"] = []
    (tmp_path / "cli" / "method-options.json").write_text(json.dumps(cached))
    assert method_flags.catalogue() == method_flags.from_registry()


# ------------------------------------------------------------------------------------------------ one name per idea

@pytest.mark.parametrize("command, old, new, param, value", [
    (["profile"], "--batch-sizes", "--batch-size", "batch_sizes", "1,2"),
    (["profile"], "--kv-lengths", "--kv-length", "kv_lengths", "16,32"),
    (["estimate"], "--batch-sizes", "--batch-size", "batch_sizes", "4"),
    (["estimate"], "--new-tokens", "--max-new-tokens", "new_tokens", 12),
    (["estimate"], "--data", "--dataset", "data", "gsm8k"),
    (["train", "ppd"], "--data", "--dataset", "data", "gsm8k"),
    (["train", "ppd"], "--new-tokens", "--max-new-tokens", "new_tokens", 12),
    (["train", "medusa"], "--new-tokens", "--max-new-tokens", "new_tokens", 12),
    (["train", "drafter"], "--batch", "--sequences", "batch", 3),
    (["train", "eval"], "--prompts", "--eval-prompts", "prompts", 5),
    (["train", "eval"], "--data", "--dataset", "data", "gsm8k"),
    (["train", "eval"], "--new-tokens", "--max-new-tokens", "new_tokens", 12),
])
def test_old_spellings_still_work_and_are_hidden(command, old, new, param, value):
    found = {tuple(path): cmd for path, cmd, _ in commands()}[tuple(command)]
    lead = ["ARTEFACT"] if command == ["train", "eval"] else []
    for spelled in ([old, str(value)], [f"{old}={value}"], [new, str(value)]):
        ctx = found.make_context(command[-1], lead + spelled)
        assert ctx.params[param] == value, spelled
    helped = invoke(*command, "--help", env=WIDE).output
    assert new in helped and not re.search(re.escape(old) + r"(?![\w-])", helped)


def test_a_name_that_is_current_elsewhere_is_not_rewritten():
    """train ppd's own --prompts (training prompts) is not train eval's old --prompts."""
    found = {tuple(path): cmd for path, cmd, _ in commands()}[("train", "ppd")]
    assert found.make_context("ppd", ["--prompts", "7"]).params["prompts"] == 7


def test_no_two_spellings_of_one_idea_across_commands():
    spellings = {opt for _, cmd, ctx in commands() for p in cmd.get_params(ctx) for opt in p.opts}
    assert not spellings & set(RENAMED), spellings & set(RENAMED)
    assert "--eval-prompts" in spellings and "--dataset" in spellings


# ------------------------------------------------------------------------------------------------ help

def test_every_option_shows_its_default_and_a_real_metavar():
    missing, bare = [], []
    for path, command, ctx in commands():
        for p in command.get_params(ctx):
            if p.param_type_name != "option" or p.is_flag or p.required:
                continue
            if p.default is None and not isinstance(p.show_default, str):
                missing.append(f"{' '.join(path)} {p.opts[0]}")
        text = invoke(*path, "--help", env=WIDE).output
        bare += [f"{' '.join(path)}: {m}" for m in re.findall(r"(?<=\s)<(?:str|bool|int|float|path|list\[\w+\])>", text)]
    assert not missing, missing
    assert not bare, bare


def test_run_help_shows_the_defaults_it_used_to_hide():
    text = invoke("run", "--help", env=WIDE).output
    assert "[default: ar, pld]" in text and "[default: humaneval]" in text and "results/<time>" in text
    assert "N|all" in text and "B[,B...]" in text


def test_help_text_survives_rich_markup():
    """Help is rich markup: a literal [ray] must be escaped or it vanishes from the screen."""
    eaten = []
    for path, command, ctx in commands():
        for p in command.get_params(ctx):
            text = getattr(p, "help", None) or ""
            if Text.from_markup(text).plain != text.replace("\\[", "["):
                eaten.append(f"{' '.join(path)} {p.opts[0]}")
    assert not eaten, eaten
    assert "pip install 'specbench[ray]'" in invoke("run", "--help", env=WIDE).output


def test_commands_are_listed_in_workflow_order():
    text = invoke("--help", env=WIDE).output
    places = [re.search(rf"│ {re.escape(name)} ", text).start() for name in WORKFLOW]
    assert places == sorted(places)
    train = invoke("train", "--help", env=WIDE).output
    assert train.index("│ ppd ") < train.index("│ eval ")


# ------------------------------------------------------------------------------------------------ errors

@pytest.mark.parametrize("args, expected", [
    (["run", "--bogus"], "specbench run: no such option --bogus"),
    (["run", "--limt", "3"], "no such option --limt (did you mean '--limit'?)"),
    (["run", "--top-k", "x"], "--top-k 'x': "),
    (["run", "--temperature", "warm"], "--temperature 'warm': "),
    (["profile", "--kv-lengths"], "option '--kv-length' requires an argument"),
    (["rnu"], "no such command 'rnu' (did you mean 'run'?)"),
    (["list", "methds"], "specbench list: no such command 'methds' (did you mean 'methods'?)"),
    (["merge", "x"], "specbench merge: missing option '--out'"),
    (["run", "--limit", "x"], "--limit 'x': expected a number of prompts or all"),
    (["profile", "--widths", "1,two"], "--widths: expected comma-separated integers, got '1,two'"),
])
def test_usage_errors_are_one_line_naming_option_and_value(args, expected):
    result = invoke(*args)
    text = said(result)
    assert result.exit_code == 2 and expected in text, text
    assert text.startswith("error:") and text.count("error:") == 1 and "hint:" in text
    assert "╭" not in result.output and "Usage:" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("args, expected", [
    (["--temperature", "-1"], "--temperature must be a number >= 0 (got -1.0)"),
    (["--temperature", "nan"], "--temperature must be a number >= 0 (got nan)"),
    (["--top-p", "2"], "--top-p must be a number in (0, 1] (got 2.0)"),
    (["--top-k", "-3"], "--top-k must be 0 (off) or more (got -3)"),
    (["--method", "pdl"], "--method pdl: unknown method (did you mean 'pld'?)"),
    (["--dataset", "gsm8"], "unknown dataset 'gsm8' (did you mean 'gsm8k'?)"),
    (["--limit", "0"], "--limit must be at least 1 (got 0); all takes every prompt"),
])
def test_bad_values_name_the_option_and_the_value(tmp_path, args, expected):
    result = invoke("run", "--model", "random:tiny", "--out", tmp_path / "r", *args)
    assert result.exit_code == 2 and expected in said(result), said(result)
    assert said(result).startswith("error:") and "Traceback" not in result.output
    assert not (tmp_path / "r" / "run.yaml").exists()


def test_did_you_mean_prefers_the_closest_name():
    methods = ["ar", "ppd", "pld", "sd", "pearl", "eagle"]
    assert did_you_mean("pdl", methods) == " (did you mean 'pld'?)"
    assert did_you_mean("eagel", methods) == " (did you mean 'eagle'?)"
    assert did_you_mean("zzz", methods) == ""


def test_limit_all(tmp_path, prompts_file):
    assert prompt_limit("all") == prompt_limit("ALL") == ALL_PROMPTS and prompt_limit("3") == 3
    with pytest.raises(SpecbenchError, match="--limit 'some': expected a number of prompts or all"):
        prompt_limit("some")
    out = tmp_path / "r"
    result = invoke("run", *TINY, "--dataset", prompts_file, "--limit", "all", "--out", out)
    assert result.exit_code == 0, result.output
    assert len(pd.read_csv(out / "records.csv")) == 2 * 5  # every prompt: 3 of one turn, 1 of two


def test_report_of_a_missing_folder_says_it_is_missing(tmp_path):
    result = invoke("report", tmp_path / "nothing")
    assert result.exit_code == 2 and f"{tmp_path / 'nothing'}: no such folder" in said(result)


def test_resume_of_a_finished_run_says_so_without_loading_the_model(tmp_path, prompts_file, monkeypatch):
    args = ["run", *TINY, "--dataset", prompts_file, "--limit", 1, "--out", tmp_path / "r"]
    assert invoke(*args).exit_code == 0

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("specbench.run.own_methods.load_model", no_model)
    again = invoke(*args, "--resume")
    assert again.exit_code == 0, again.output
    assert f"Nothing to resume: every prompt of {tmp_path / 'r'} has run" in said(again)


def _interrupt_second_prompt(monkeypatch):
    real, calls = Runner.run_prompt, {"n": 0}

    def run_prompt(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # ar and pld finished prompt 0; Ctrl-C on prompt 1
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Runner, "run_prompt", run_prompt)


def test_ctrl_c_prints_the_exact_resume_command(tmp_path, prompts_file, monkeypatch):
    _interrupt_second_prompt(monkeypatch)
    args = ["run", *TINY, "--dataset", str(prompts_file), "--limit", "2", "--out", str(tmp_path / "r")]
    result = invoke(*args)
    assert result.exit_code == 130
    assert f"to continue: {shlex.join(['specbench', *args, '--resume'])}" in said(result)


def test_ctrl_c_of_a_run_in_the_default_folder_names_the_folder(tmp_path, prompts_file, monkeypatch):
    monkeypatch.setenv("SPECBENCH_RESULTS", str(tmp_path / "results"))
    _interrupt_second_prompt(monkeypatch)
    result = invoke("run", *TINY, "--dataset", prompts_file, "--limit", 2)
    folder = next((tmp_path / "results").iterdir())
    assert result.exit_code == 130 and f"--resume --out {folder}" in said(result)


def test_train_commands_default_to_the_training_mix():
    """--dataset left out of a train command: the config's own default, the training mix."""
    from specbench.cli.train import configured
    from specbench.train.configs import DrafterConfig, EagleConfig, MedusaConfig, ParallelSpecConfig, TransferConfig
    from specbench.train.settings import TRAINING_MIX, cli_options

    for cls in (DrafterConfig, MedusaConfig, TransferConfig, EagleConfig, ParallelSpecConfig):
        assert cli_options(cls)["data"]["default"] == TRAINING_MIX
        assert configured(cls, {"steps": 3}).data == TRAINING_MIX
        assert configured(cls, {"data": "gsm8k"}).data == "gsm8k"


def test_dash_h_is_help_everywhere_and_the_usage_line_names_what_to_type():
    for args in (["-h"], ["report", "-h"], ["train", "ppd", "-h"], ["list", "methods", "-h"]):
        result = invoke(*args, env=WIDE)
        assert result.exit_code == 0 and "Usage: specbench" in result.output, (args, result.output)
    usage = next(line for line in invoke("report", "--help", env=WIDE).output.splitlines() if "Usage:" in line)
    assert "{runs}" not in usage and "DIR..." in usage


@pytest.mark.parametrize("args, expected", [
    (["--widths", "0,1"], "--widths: every value must be at least 1 (got 0)"),
    (["--kv-length", "0"], "--kv-length: every value must be at least 1 (got 0)"),
    (["--repeats", "0"], "--repeats must be at least 1 (got 0)"),
])
def test_profile_range_errors_name_the_option(args, expected):
    result = invoke("profile", "--model", "random:tiny", *args)
    assert result.exit_code != 0 and expected in said(result) and "Traceback" not in result.output


def test_plan_of_an_unknown_random_preset_lists_the_presets():
    result = invoke("plan", "--model", "random:tiyn")
    text = said(result)
    assert result.exit_code != 0 and "random:tiyn: unknown preset (did you mean 'tiny'?)" in text
    assert "vicuna-7b" in text and "Repo id" not in text

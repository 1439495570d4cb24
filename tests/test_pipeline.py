"""Your own model and your own prompts, end to end (issue 16): `profile -> train ppd -> estimate -> build-tree -> run`
link up through one file-name key per model (core.models.model_slug) with no path passed by hand; refusals say
what to run, naming the model exactly as given, and leave no empty folders behind."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.machine.hardware import hardware_slug
from specbench.core.model.load import load_model, model_slug

HW = hardware_slug(torch.device("cpu"))
FAST_PROFILE = ["--widths", "1,2,4,8", "--kv-lengths", "32", "--repeats", "1"]
FAST_TRAIN = ["--steps", "2", "--held-out", "2", "--new-tokens", "12", "--insertions", "4", "--data", "prompts.jsonl"]
FAST_ESTIMATE = ["--data", "prompts.jsonl", "--limit", "2", "--new-tokens", "12"]
FAST_RUN = ["--dataset", "prompts.jsonl", "--limit", "2", "--max-new-tokens", "8", "--warmup", "0"]


def _byte_tokenizer():
    """A byte-level BPE tokenizer without merges (256 byte tokens + 4 specials), as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for special in ("<s>", "</s>", "<pad>", "<unk>"):
        vocab[special] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A user's own model: a tiny random-weight Llama saved with save_pretrained to a local folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("models") / "my-llama"
    tok = _byte_tokenizer()
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """An empty working directory (nothing is written into the repo), its own cache, and the user's prompts."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    (work / "prompts.jsonl").write_text("".join(json.dumps({"instruction": f"Tell me about item {i} and why."}) + "\n"
                                                for i in range(8)))
    return work


def sb(*args: str, code: int = 0) -> str:
    """Run the CLI; check the exit code and that no traceback escaped; return the output with wrapping undone."""
    res = CliRunner().invoke(app, list(args))
    text = " ".join(res.output.split())
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    return text


def suggested(text: str, command: str) -> str:
    """The `specbench COMMAND ...` a message suggests."""
    found = re.search(rf"`(specbench {command}[^`]*)`", text)
    assert found, f"no `specbench {command}` suggested in: {text}"
    return found.group(1)


def chain(model: str, work: Path) -> dict:
    """The whole pipeline for a model, each step finding the last one's file by itself; returns run.yaml."""
    key = model_slug(model)
    sb("profile", "--model", model, *FAST_PROFILE)
    assert (work / "profiles" / HW / f"{key}-float32.yaml").is_file()
    said = sb("train", "ppd", "--model", model, *FAST_TRAIN)
    assert re.search(r"about \d+ s on this machine", said) and said.index("about") < said.index("Wrote")
    assert (work / "artifacts" / key / "ppd" / "ppd.yaml").is_file()
    sb("estimate", "--method", "ppd", "--model", model, *FAST_ESTIMATE)
    acceptance = work / "acceptance" / key / "ppd.yaml"
    assert acceptance.is_file()
    sb("build-tree", "--model", model, "--gpu", "cpu", "--max-size", "8")
    tree = work / "trees" / key / f"{HW}-float32.yaml"
    assert Path(yaml.safe_load(tree.read_text())["acceptance"]).resolve() == acceptance.resolve()
    said = sb("run", "--model", model, "--method", "ppd", *FAST_RUN, "--out", "run")
    assert "generic" not in said
    meta = yaml.safe_load((work / "run" / "run.yaml").read_text())
    assert meta["model"]["spec"] == model
    assert Path(meta["trees"]["ppd"]["tree"]) == tree.resolve()  # --tree auto found this hardware's tree
    assert Path(meta["trees"]["ppd"]["acceptance"]) == acceptance.resolve()  # predicted tau: the model's own
    assert meta["trees"]["ppd"]["profile"] == f"{HW} float32 (measured)"
    records = pd.read_csv(work / "run" / "records.csv")
    assert set(records.model) == {model} and set(records.method) == {"ar", "ppd"}
    assert "Predicted tau from " + str(acceptance.resolve()) in (work / "run" / "report.md").read_text()
    return meta


# ------------------------------------------------------------------------------------------ the pipeline

def test_a_local_model_goes_from_nothing_to_a_hardware_aware_ppd_run(model_dir, workdir):
    chain(str(model_dir), workdir)
    assert not list(model_dir.parent.glob("*.yaml")) and not list(model_dir.parent.glob("*.png"))  # nothing beside it
    assert sorted(p.name for p in workdir.iterdir()) == ["acceptance", "artifacts", "profiles", "prompts.jsonl",
                                                         "run", "trees"]


def test_a_gguf_file_goes_through_the_same_pipeline(workdir):
    from .test_own_model import write_gguf

    models = workdir.parent / "models"
    models.mkdir()
    write_gguf(models / "mine.gguf")
    meta = chain(str(models / "mine.gguf"), workdir)
    assert meta["model"]["name"] == "mine"
    assert sorted(p.name for p in (workdir / "artifacts").iterdir()) == ["mine"]
    write_gguf(models / "other.gguf", seed=1)  # a second file in the same folder is another model
    said = sb("run", "--model", str(models / "other.gguf"), "--method", "ppd", *FAST_RUN, "--out", "r2", code=2)
    assert suggested(said, "train ppd") == f"specbench train ppd --model {models / 'other.gguf'}"
    assert "artifacts/other/ppd" in said


# ------------------------------------------------------------------------------------------ one name per model

def test_one_file_name_key_per_model(tmp_path, monkeypatch):
    models = tmp_path / "models"
    (models / "tinydir").mkdir(parents=True)
    assert model_slug(str(models / "m.gguf")) == "m"  # the file, not its folder
    assert model_slug(str(models / "m2.gguf")) == "m2"  # two GGUF files in one folder: two models
    assert model_slug(str(models / "SmolLM2-135M-Instruct.Q4_1.gguf")) == "smollm2-135m-instruct.q4_1"
    assert model_slug(str(models / "tinydir")) == model_slug(str(models / "tinydir") + "/") == "tinydir"
    monkeypatch.chdir(models / "tinydir")
    assert model_slug(".") == "tinydir"
    monkeypatch.chdir(models)
    assert model_slug("tinydir") == model_slug("./tinydir") == "tinydir"
    assert model_slug("smollm2-135m") == "smollm2-135m"  # the shipped artefacts keep their folders
    assert model_slug("random:smollm2-135m") == "smollm2-135m"  # random weights profile like the real model
    assert model_slug("random:tiny") == "tiny"
    assert model_slug(f"random:{models / 'tinydir' / 'config.json'}") == "tinydir"
    assert model_slug("Qwen/Qwen2.5-0.5B") == "qwen--qwen2.5-0.5b"  # not "qwen2", not "--qwen--..."
    assert model_slug("HuggingFaceTB/SmolLM2-135M-Instruct") == "huggingfacetb--smollm2-135m-instruct"
    assert model_slug(str(models / "my model (v2).gguf")) == "my-model-v2"


def test_every_command_reads_and_writes_under_the_same_key(model_dir, workdir):
    from specbench.methods.ppd import artifact as pt
    from specbench.methods.sd.training import DrafterConfig
    from specbench.methods.ppd.training import TrainConfig
    from specbench.planning import acceptance, profile

    spec = str(model_dir)
    f32, bf16 = load_model(spec, "float32", "cpu"), load_model(spec, "bfloat16", "cpu")
    assert f32.spec == bf16.spec == spec and f32.name == "my-llama"
    key = "my-llama"
    assert TrainConfig(model=spec).out_dir == Path("artifacts") / key / "ppd"
    assert DrafterConfig(model=spec).out_dir == Path("artifacts") / key / "drafter"
    assert pt.default_path(f32).parts[-3:] == pt.default_path(bf16).parts[-3:] == ("artifacts", key, "ppd")
    assert acceptance.default_path(spec) == Path("acceptance") / key / "ppd.yaml"
    for target in (f32, bf16):
        measured = profile.measure(target, widths=(1, 2), kv_lengths=(8,), repeats=1, warmup=0)
        assert measured.model == key and measured.meta["model_spec"] == spec
        assert profile.default_path(measured) == Path("profiles") / HW / f"{key}-{measured.dtype}.yaml"


def test_a_drafter_trained_here_is_found_by_itself(model_dir, workdir):
    from specbench.methods.sd.drafter import default_artifact, layer_drafter, save_artifact

    target = load_model(str(model_dir), "float32", "cpu")
    assert default_artifact(target) is None
    drafter = layer_drafter(target, [0])
    save_artifact(drafter.model, Path("artifacts") / "my-llama" / "drafter",
                  {"init_layers": [0], "target": target.spec, "target_fingerprint": target.fingerprint()})
    assert default_artifact(target) == Path("artifacts") / "my-llama" / "drafter"  # where `train drafter` writes


# ------------------------------------------------------------------------------------------ refusals

def test_suggested_commands_name_the_model_as_given_and_run(model_dir, workdir):
    for spec in (str(model_dir), os.path.relpath(model_dir) + "/"):  # absolute; relative, as typed
        said = sb("run", "--model", spec, "--method", "ppd", *FAST_RUN, code=2)
        assert suggested(said, "train ppd") == f"specbench train ppd --model {spec}"
        said = sb("estimate", "--method", "ppd", "--model", spec, *FAST_ESTIMATE, code=2)
        assert suggested(said, "train ppd") == f"specbench train ppd --model {spec}"
        said = sb("build-tree", "--model", spec, "--gpu", "cpu", code=2)
        assert suggested(said, "estimate") == f"specbench estimate --method ppd --model {spec}"
        said = sb("run", "--model", spec, "--method", "sd", *FAST_RUN, code=2)
        assert suggested(said, "train drafter") == f"specbench train drafter --model {spec}"
    spec = str(model_dir)
    key = model_slug(spec)
    (workdir / "acceptance" / key).mkdir(parents=True)
    (workdir / "acceptance" / key / "ppd.yaml").write_text(yaml.safe_dump({"per_rank": [[0.5, 0.1]] * 3}))
    said = sb("build-tree", "--model", spec, "--gpu", "cpu", code=2)
    command = suggested(said, "profile")
    assert command.startswith(f"specbench profile --model {spec} ")
    sb(*command.split()[1:], *FAST_PROFILE)  # the suggestion runs as written ...
    sb("build-tree", "--model", spec, "--gpu", "cpu", "--max-size", "8")  # ... and build-tree then finds its file
    assert (workdir / "trees" / key / f"{HW}-float32.yaml").is_file()


def test_a_refused_run_leaves_no_empty_folders(model_dir, workdir):
    sb("run", "--model", str(model_dir), "--method", "ppd", *FAST_RUN, "--out", "results/deep/run", code=2)
    sb("run", "--model", str(workdir / "no-such-model"), *FAST_RUN, "--out", "results/x", code=2)
    sb("run", "--model", str(model_dir), "--method", "ppd", *FAST_RUN, code=2)  # default out: results/<time>
    assert sorted(p.name for p in workdir.iterdir()) == ["prompts.jsonl"]
    (workdir / "mine").mkdir()  # a folder the user made is theirs: kept
    sb("run", "--model", str(model_dir), "--method", "ppd", *FAST_RUN, "--out", "mine", code=2)
    assert (workdir / "mine").is_dir()


def test_predicted_tau_from_a_generic_table_is_said(model_dir, workdir):
    said = sb("run", "--model", str(model_dir), "--method", "ppd", "--artifact", "untrained", *FAST_RUN, "--out", "r")
    assert "generic acceptance table" in said and f"estimate --method ppd --model {model_dir}" in said
    # no tree of this hardware yet: the commands that make ppd's, for this dtype and device
    assert suggested(said, "profile") == f"specbench profile --model {model_dir} --dtype float32 --device cpu"
    assert suggested(said, "build-tree") == f"specbench build-tree --model {model_dir} --gpu cpu --dtype float32"
    meta = yaml.safe_load((workdir / "r" / "run.yaml").read_text())
    assert meta["trees"]["ppd"]["acceptance"].startswith("a generic acceptance table")
    assert "Predicted tau is not this model's" in (workdir / "r" / "report.md").read_text()


# ------------------------------------------------------------------------------------------ train ppd's size

def test_train_data_follows_the_steps_and_the_time_is_said_first(model_dir, workdir):
    said = sb("train", "ppd", "--model", str(model_dir), *FAST_TRAIN)
    plan = said[: said.index("Wrote")]
    assert re.search(r"self-distil 2 prompts x up to 12 tokens \(about \d+ s\), then 2 steps \(about \d+ s\)", plan)
    meta = yaml.safe_load((workdir / "artifacts" / "my-llama" / "ppd" / "ppd.yaml").read_text())
    assert meta["data"]["sources"]["prompts.jsonl"]["prompts"] == "2..3"  # 2 steps use 2 sequences, not 300
    assert meta["data"]["sequences"] == 2 and len(meta["top1_heldout"]) == 3  # scored on prompts 0..1, held out
    again = sb("train", "ppd", "--model", str(model_dir), *FAST_TRAIN)
    assert "self-distilled data of 2 prompts per source cached" in again


def test_auto_prompts_and_the_generation_estimate():
    from specbench.train.selfdistill import generation_seconds
    from specbench.methods.ppd.training import auto_prompts, duration

    assert auto_prompts(20, 1) == 20 and auto_prompts(450, 1) == 300 and auto_prompts(20, 3) == 7
    prompts = [[0] * 10] * 40  # 40 10-token prompts, 5 new tokens each, 32 slots
    got = generation_seconds(None, prompts, 5, costs=(0.01, 0.001))
    # prefills: 2 forwards and 400 tokens; decoding: 200 tokens, 32 a step with refill (7 steps)
    assert got == pytest.approx(2 * 0.01 + 400 * 0.001 + 7 * 0.01 + 200 * 0.001)
    assert duration(42) == "42 s" and duration(1800) == "30 min" and duration(4 * 3600) == "4.0 h"

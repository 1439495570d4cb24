"""A target placed by a device map (issue 27): part of its layers resident on "cpu", part offloaded to "disk"
(accelerate's offload hooks, the machinery that moves tensors between devices). Every registered method must give
single-device ar's greedy tokens, at batch 1 and batch > 1; plus the placement flags' parsing and refusals."""

from __future__ import annotations

import json

import pytest
import torch

from specbench.core.model import placement as pl
from specbench.core.model.load import load_model
from specbench.core.verify import Sampling
from specbench.errors import SpecbenchError
from specbench.methods import REGISTRY
from specbench.methods.batch_loop import generate_batch

from .conftest import FOUR_LAYERS, prompt_ids
from .test_methods import build

# embeddings (tied with the LM head) and layers 0, 2, 3 on disk; layer 1 and the final norm resident
DISK_MAP = {"model.embed_tokens": "disk", "model.layers.0": "disk", "model.layers.1": "cpu",
            "model.layers.2": "disk", "model.layers.3": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu",
            "lm_head": "disk"}
BATCHABLE = sorted(n for n, c in REGISTRY.items() if c.batchable)
PROMPTS = [prompt_ids(seed, length=6 + 3 * seed) for seed in range(3)]


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("devmap") / "four-mapped.json"
    path.write_text(json.dumps(FOUR_LAYERS))
    return path


@pytest.fixture(scope="module")
def resident(config_path):
    return load_model(f"random:{config_path}", dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def offloaded(config_path, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("SPECBENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
    where = pl.Placement(DISK_MAP, offload_folder=str(tmp_path_factory.mktemp("offload")))
    return load_model(f"random:{config_path}", dtype="float32", device="cpu", placement=where)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_the_map_offloads_and_is_named(offloaded):
    assert any(p.device.type == "meta" for p in offloaded.model.parameters())  # really offloaded
    assert offloaded.placement == "map:disk:3,cpu:1"
    assert offloaded.input_device == offloaded.output_device == torch.device("cpu")
    assert pl.label_slug(offloaded.placement) == "map-diskx3-cpux1"


def test_same_weights_as_the_resident_model(resident, offloaded):
    assert offloaded.fingerprint() == resident.fingerprint()


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("seed", [0, 1])
def test_every_method_equals_single_device_ar(resident, offloaded, name, seed):
    ids = prompt_ids(seed)
    reference = build("ar", resident).generate(ids, 32, Sampling(), None).tokens
    assert build(name, offloaded).generate(ids, 32, Sampling(), None).tokens == reference


@pytest.mark.parametrize("name", BATCHABLE)
@pytest.mark.parametrize("mode", ["unpadded", "padded"])
def test_every_batched_method_equals_single_device_ar(resident, offloaded, name, mode):
    reference = [build("ar", resident).generate(p, 24, Sampling(), None).tokens for p in PROMPTS]
    gens, _ = generate_batch(build(name, offloaded), PROMPTS, 2, mode, True, 24, Sampling(), [None] * 3)
    assert [g.tokens for g in gens] == reference


# ---- flags -------------------------------------------------------------------------------------------------------

def test_sizes_and_devices_parse():
    assert pl.parse_max_memory("0=20GiB, 1=512MiB,cpu=1.5GB") == {0: 20 * 2**30, 1: 512 * 2**20, "cpu": 1.5e9}
    assert pl.parse_device("cuda:1", "x") == 1
    assert pl.parse_device_map("balanced") == "balanced"
    assert pl.build_placement(None, None) == pl.SINGLE
    assert pl.build_placement(None, "cpu=2GiB").device_map == "auto"  # caps alone: accelerate fills under them


@pytest.mark.parametrize("text,said", [("0=20XB", "bad size"), ("0:20GiB", "DEV=SIZE"), ("gpu0=1GiB", "unknown device")])
def test_bad_max_memory_is_refused_clearly(text, said):
    with pytest.raises(SpecbenchError, match=said):
        pl.parse_max_memory(text)


def test_bad_device_map_files_are_refused_clearly(tmp_path):
    with pytest.raises(SpecbenchError, match="neither one of auto"):
        pl.parse_device_map("everywhere")
    with pytest.raises(SpecbenchError, match="cannot read"):
        pl.parse_device_map(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(SpecbenchError, match="not valid JSON"):
        pl.parse_device_map(str(tmp_path / "bad.json"))
    (tmp_path / "dev.json").write_text('{"model.layers.0": "tpu"}')
    with pytest.raises(SpecbenchError, match="unknown device 'tpu'"):
        pl.parse_device_map(str(tmp_path / "dev.json"))
    with pytest.raises(SpecbenchError, match="exclusive"):
        pl.build_placement("auto", None, tp=2)


def test_missing_gpu_is_refused_before_loading(config_path, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    (tmp_path / "gpu.json").write_text(json.dumps({"": 0}))
    with pytest.raises(SpecbenchError, match="name GPU 0 but this machine has no GPU"):
        load_model(f"random:{config_path}", dtype="float32", device="cpu",
                   placement=pl.build_placement(str(tmp_path / "gpu.json"), None))


def test_a_map_that_overfills_a_device_shows_the_table(monkeypatch, config_path):
    from specbench.core.model import fit_devices

    monkeypatch.setattr(fit_devices, "free_bytes", lambda dev, folder: 1000 if dev == "cpu" else 10**12)
    with pytest.raises(SpecbenchError) as err:
        load_model(f"random:{config_path}", dtype="float32", device="cpu",
                   placement=pl.Placement(DISK_MAP, offload_folder="/tmp"))
    said = str(err.value)
    assert "does not fit this device map" in said and "<- does not fit" in said
    assert "disk" in said and "--device-map auto --max-memory" in said


# ---- tensor parallelism: what CPU allows without torchrun (the launch check, which rank writes) ---------------------

def test_tp_outside_torchrun_is_refused(monkeypatch):
    from specbench.core.model import tensor_parallel as tp

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SpecbenchError, match="torchrun --nproc-per-node 2"):
        pl.target_placement(None, None, 2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SpecbenchError, match="without --tp 2"):
        tp.check_launch(1)
    assert pl.target_placement(None, None, 2).tp == 2
    assert "distributed_config" in pl.target_placement(None, None, 2).load_kwargs() or \
        pl.target_placement(None, None, 2).load_kwargs() == {"tp_plan": "auto"}


def test_only_rank_zero_writes_the_run_folder(monkeypatch, tmp_path):
    from specbench.core.model import tensor_parallel as tp

    monkeypatch.setenv("RANK", "0")
    assert tp.is_writer() and tp.rank_out(tmp_path) == tmp_path
    monkeypatch.setenv("RANK", "1")
    other = tp.rank_out(tmp_path)
    assert not tp.is_writer() and other != tmp_path and "rank1" in other.name


def test_pearl_is_refused_tensor_parallel():
    from specbench.run.config import RunConfig
    from specbench.run.validation import validate

    with pytest.raises(SpecbenchError, match="cannot run tensor-parallel"):
        validate(RunConfig(methods=("pearl",), tp=2))


def test_records_and_profiles_name_the_placement():
    from specbench.core import store
    from specbench.run.results import RECORD_COLUMNS

    assert "placement" in RECORD_COLUMNS
    assert store.profile_file("h", "m", "float32", "single:cpu").name == "m-float32.yaml"
    assert store.profile_file("h", "m", "float32", "map:0:16,1:14").name == "m-float32@map-0x16-1x14.yaml"
    assert store.profile_file("h", "m", "float32", "tp2").name == "m-float32@tp2.yaml"


def test_run_with_a_device_map_names_it_in_records_and_run_yaml(tmp_path, prompts_file, monkeypatch):
    import pandas as pd
    import yaml
    from typer.testing import CliRunner

    from specbench.cli import app

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    dmap = tmp_path / "map.json"
    dmap.write_text(json.dumps({"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "cpu",
                                "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--model", "random:tiny", "--dtype", "float32", "--device", "cpu",
                                      "--max-new-tokens", "16", "--warmup", "0", "-m", "pld", "--dataset",
                                      str(prompts_file), "--limit", "2", "--device-map", str(dmap), "--out", str(out)])
    assert result.exit_code == 0, result.output
    records = pd.read_csv(out / "records.csv")
    assert set(records.placement) == {"map:disk:1,cpu:1"}
    assert (records[records.method == "pld"].lossless == "match").all()
    meta = yaml.safe_load((out / "run.yaml").read_text())
    assert meta["environment"]["placement"] == "map:disk:1,cpu:1"
    assert meta["model"]["device_map"]["model.layers.0"] == "disk"
    from specbench.report.titles import plot_title

    assert "[map:disk:1,cpu:1]" in plot_title(meta, records)  # every plot's title names the placement

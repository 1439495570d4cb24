"""The fit check (core/model/fit.py, memory_need.py): a command's need part by part (weights, KV at its context and
batch, activations, working memory), flags that would fit, and a refusal before anything is allocated."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from specbench.core.model import fit, memory_need as mn
from specbench.core.model.load import model_config
from specbench.errors import SpecbenchError

# Qwen2.5-0.5B's published config.json (Qwen/Qwen2.5-0.5B): 24 layers, 14 heads of 64, 2 KV heads, tied embeddings
QWEN_05B = dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6)
CPU = torch.device("cpu")


def qwen():
    from transformers import AutoConfig

    cfg = dict(QWEN_05B)
    return AutoConfig.for_model(cfg.pop("model_type"), **cfg)


def test_need_counts_weights_kv_and_activations_part_by_part():
    work = mn.Workload(tokens=1000, batch=3, width=64, logits=8)
    found = mn.need("qwen", qwen(), torch.bfloat16, CPU, work)
    assert 494e6 < found.params < 495e6  # Qwen2.5-0.5B: 494M parameters (embeddings tied)
    assert found.parts["weights"] == found.params * 2
    assert found.parts["KV cache"] == 24 * 2 * 2 * 64 * 2 * 1000 * 3  # layers x K,V x kv heads x head dim x bytes
    assert found.parts["activations"] > 8 * 3 * 151936 * 6  # at least the kept logits, bf16 + a float32 copy
    assert found.total == sum(found.parts.values())
    wider = mn.need("qwen", qwen(), torch.bfloat16, CPU, mn.Workload(tokens=1000, batch=3, width=128, logits=8))
    assert wider.parts["activations"] > found.parts["activations"]
    said = found.said()
    assert said.startswith(f"needs about {found.total / 2**30:.1f} GiB = weights ")
    assert "0.49B parameters in bfloat16" in said and "KV cache" in said and "activations" in said


def test_a_compiled_cpu_run_counts_its_packed_copies():
    """--compile on a CPU: the fused q/k/v + gate/up copy (the packed copy of every linear weight is counted on its
    own, compiled or not, where cpu_kernels packs that dtype), in float32 and bfloat16 a copy in panels of every linear
    weight too (panel_linear.py); nothing of it on another device."""
    from specbench.core.model import cpu_kernels

    work = mn.Workload(tokens=1000, width=8)
    plain = mn.need("qwen", qwen(), torch.bfloat16, CPU, work)
    compiled = mn.need("qwen", qwen(), torch.bfloat16, CPU, mn.Workload(tokens=1000, width=8, compiled=True))
    grouped = 24 * 896 * (14 * 64 + 2 * 2 * 64 + 2 * 4864) * 2  # q, k, v, gate, up per layer, bf16
    extra = compiled.parts["compiled step's packed copies"]
    assert "compiled step's packed copies" not in plain.said() and compiled.total == plain.total + extra
    packed = plain.parts["packed copy (oneDNN)"]
    assert (0 < packed < plain.parts["weights"]) == cpu_kernels.packable(torch.bfloat16)  # embeddings tied: below
    as_f32 = mn.need("qwen", qwen(), torch.float32, CPU, mn.Workload(tokens=1000, width=8, compiled=True))
    panels = as_f32.parts["packed copy (oneDNN)"]  # float32: every linear weight once more, in panels
    assert panels > 0 and as_f32.parts["compiled step's packed copies"] == 2 * grouped + panels
    assert extra == grouped + panels // 2  # bfloat16's panels: every linear weight once more, at 2 bytes
    gpu = mn.need("qwen", qwen(), torch.bfloat16, torch.device("cuda"), mn.Workload(width=8, compiled=True))
    assert gpu.parts["compiled step's packed copies"] == 0


def test_without_a_workload_the_check_is_the_load_and_a_default_kv(monkeypatch):
    params, total = fit.memory_need(qwen(), torch.float32, CPU)
    kv = 24 * 2 * 2 * 64 * 4 * mn.KV_HEADROOM_TOKENS
    assert total >= params * 4 + kv + mn.RUNTIME_HEADROOM  # float32 weights (+ a packed copy for small models)
    with mn.stated_workload(mn.Workload(tokens=8192, batch=2, what="a stated workload")):
        _, planned_total = fit.memory_need(qwen(), torch.float32, CPU)
    assert planned_total - total == 24 * 2 * 2 * 64 * 4 * (8192 * 2 - mn.KV_HEADROOM_TOKENS)
    assert mn.current() == mn.Workload()  # the block's workload ends with it


def test_a_refusal_names_the_parts_and_flags_that_fit(monkeypatch):
    cfg = model_config("random:llama-3.1-8b")
    free = 20 * 2**30
    monkeypatch.setattr(fit, "free_memory_bytes", lambda device: free)
    work = mn.Workload(tokens=8192, batch=8, width=128, what="8192 tokens x batch 8")
    with mn.stated_workload(work), pytest.raises(SpecbenchError) as err:
        fit.check_memory("meta-llama/Llama-3.1-8B", cfg, torch.float32, CPU)
    said = str(err.value)
    assert "weights 29.92 (8.03B parameters in float32)" in said and "KV cache 16.00 (8192 tokens x batch 8)" in said
    assert "20.0 GiB of memory available" in said
    assert "--dtype bfloat16 (needs" in said and "--device-map auto --max-memory cpu=18GiB" in said
    with mn.stated_workload(work), pytest.raises(SpecbenchError) as err:  # random weights are built whole: no map helps
        fit.check_memory("random:llama-3.1-8b", cfg, torch.float32, CPU)
    said = str(err.value)
    assert "--device-map" not in said  # float32 with the same KV: 1.5B of the presets fits in 20 GiB, 7B does not
    assert said.endswith("the largest preset that fits here: --model random:qwen2.5-1.5b.")
    with mn.stated_workload(work), pytest.raises(SpecbenchError) as err:  # bf16: 15 GiB of weights + 4 GiB KV at batch 8
        fit.check_memory("random:llama-3.1-8b", cfg, torch.bfloat16, CPU)
    flag = str(err.value).split("--batch-size ")[1].split(" ")[0]
    smaller = mn.need("", cfg, torch.bfloat16, CPU, mn.Workload(tokens=8192, batch=int(flag), width=128))
    assert 1 <= int(flag) < 8 and smaller.total <= free  # the suggested batch fits


CHILD = textwrap.dedent("""
    import re, sys
    from pathlib import Path
    from typer.testing import CliRunner
    from specbench.cli.app import app
    res = CliRunner().invoke(app, sys.argv[1:])
    hwm = int(re.search(r"^VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1)) // 1024
    print(res.exit_code, hwm)
    print(res.output)
""")


@pytest.mark.parametrize("command", [["profile"], ["run", "--method", "ar", "--limit", "1"]])
def test_a_70b_model_is_refused_with_numbers_before_anything_is_allocated(command, tmp_path):
    """The bar of issue 43: `specbench profile|run --model random:llama-3.1-70b` here is refused with the numbers,
    and the process never grows past what python + torch + transformers take (peak RSS, VmHWM, of its own)."""
    out = subprocess.run([sys.executable, "-c", CHILD, *command, "--model", "random:llama-3.1-70b", "--dtype",
                          "bfloat16", *(["--out", str(tmp_path / "run")] if command[0] == "run" else [])],
                         capture_output=True, text=True, timeout=300)
    code, peak_mb = map(int, out.stdout.splitlines()[0].split())
    said = " ".join(out.stdout.splitlines()[1:])
    assert code == 2, out.stdout + out.stderr
    assert "weights 131.42 (70.55B parameters in bfloat16)" in said and "KV cache" in said
    assert "memory available" in said and "the largest preset that fits here" in said and "Traceback" not in said
    assert peak_mb < 1500  # 131 GiB of weights asked for; nothing of them was allocated


def test_training_counts_the_optimiser_state_and_the_cached_features(monkeypatch):
    """A Medusa run on an 8B target: 15 GiB of bf16 weights fit in 18 GiB, the heads' AdamW state (3 heads of
    4096 x 4096, float32 value + gradient + two moments) and the features cached for 600 sequences do not."""
    from specbench.train.configs import MedusaConfig
    from specbench.train.recipe import load_target

    monkeypatch.setattr(fit, "free_memory_bytes", lambda device: 18 * 2**30)
    cfg = MedusaConfig(model="random:llama-3.1-8b", dtype="bfloat16", device="cpu")
    with pytest.raises(SpecbenchError) as err:
        load_target(cfg)
    said = str(err.value)
    state = 3 * (4096 * 4096 + 4096) * 16 / 2**30
    features = 120 * 5 * (64 + 96) * 4096 * 4 * 2 / 2**30  # prompts x sources x tokens x hidden x float32 x 2 states
    assert "weights 14.96" in said and f"training state {state:.2f}" in said
    assert f"cached features {features:.2f}" in said

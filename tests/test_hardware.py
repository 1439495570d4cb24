"""Hardware identity: CPUs that share a marketing name but not a latency curve get different keys, and files from
other hardware are labelled borrowed, never silently used as this machine's."""

from __future__ import annotations

import torch
import yaml

from specbench.core.machine import hardware
from specbench.core.model import load as models
from specbench.core.machine.hardware import isa_tier, provenance, slug_of
from specbench.planning.latency_estimate import resolve_profile
from specbench.planning.profile import LatencyProfile

CPU = torch.device("cpu")

AVX2_EPYC = {"kind": "cpu", "vendor": "amd", "name": "AMD EPYC", "family": 23, "model": 49, "isa": ["avx2"],
             "cores": 2}
ZEN4_EPYC = {**AVX2_EPYC, "family": 25, "model": 17,
             "isa": ["avx2", "avx512f", "avx512_bf16", "avx512_vnni"]}
AMX_XEON = {"kind": "cpu", "vendor": "intel", "name": "Intel(R) Xeon(R) Processor", "family": 6, "model": 143,
            "isa": ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"], "cores": 2}


def test_same_name_different_isa_get_different_slugs():
    assert slug_of(AVX2_EPYC) == "cpu-amd-epyc-avx2-2c"
    assert slug_of(ZEN4_EPYC) == "cpu-amd-epyc-avx512bf16-2c"
    assert slug_of(AMX_XEON) == "cpu-intel-xeon-amx-2c"
    assert slug_of({**AVX2_EPYC, "cores": 16}) == "cpu-amd-epyc-avx2-16c"
    assert slug_of({**AVX2_EPYC, "name": "AMD EPYC 9R14 96-Core Processor"}) == "cpu-amd-epyc-9r14-avx2-2c"
    assert isa_tier([]) == "base" and isa_tier(["avx512f"]) == "avx512"


def test_cpu_identity_reads_cpuinfo(monkeypatch):
    block = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nstepping\t: 1\n"
             "model name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16 sse\n")
    monkeypatch.setattr(hardware, "_cpuinfo_fields", lambda: {
        k.strip(): v.strip() for k, _, v in (line.partition(":") for line in block.splitlines())})
    monkeypatch.setattr(hardware, "cpu_model", lambda: "AMD EPYC")
    monkeypatch.setattr(hardware, "usable_cores", lambda: 2)
    ident = hardware.cpu_identity()
    assert (ident["vendor"], ident["family"], ident["model"]) == ("amd", 25, 17)
    assert ident["isa"] == ["avx2", "avx512f", "avx512_bf16"]
    assert slug_of(ident) == "cpu-amd-epyc-avx512bf16-2c"


def test_provenance_says_measured_here_or_borrowed():
    assert provenance(slug_of(AVX2_EPYC), AVX2_EPYC, AVX2_EPYC) == "measured here"
    borrowed = provenance(slug_of(AVX2_EPYC), AVX2_EPYC, ZEN4_EPYC)
    assert borrowed.startswith("borrowed from cpu-amd-epyc-avx2-2c") and "isa avx2 vs" in borrowed
    partial = {**AVX2_EPYC, "family": None, "model": None}
    assert provenance(slug_of(partial), partial, AVX2_EPYC).startswith("same hardware class (family, model")
    assert provenance(slug_of(AVX2_EPYC), None, AVX2_EPYC) == "same hardware class (identity not recorded)"
    assert provenance("cpu-amd-epyc", None, AVX2_EPYC).startswith("borrowed from cpu-amd-epyc")  # old-style key


def _profile(slug, ident, dtype, ms):
    return LatencyProfile("m", dtype, slug, "measured", [1, 2, 4, 8, 16], {512: {k: ms for k in
                          ("median_ms", "p10_ms", "p90_ms")}}, {"identity": ident})


def test_gpu_cpu_never_takes_another_cpus_profile(tmp_path):
    folder = tmp_path / slug_of(AVX2_EPYC)
    folder.mkdir()
    (folder / "m-float32.yaml").write_text(_profile(folder.name, AVX2_EPYC, "float32", [1.0] * 5).to_yaml())
    import pytest

    from specbench.errors import SpecbenchError

    with pytest.raises(SpecbenchError, match="Profiles of other CPUs exist .*borrow it knowingly"):
        resolve_profile("cpu", "m", None, "float32", slug_of(ZEN4_EPYC), [1], root=tmp_path)
    got = resolve_profile("cpu", "m", None, "float32", slug_of(AVX2_EPYC), [1], root=tmp_path)
    assert got.identity == AVX2_EPYC


def test_auto_dtype_on_cpu_follows_this_cpus_profiles(tmp_path, monkeypatch):
    """bf16 where its measured curve is lower (AMX / AVX512-BF16), float32 where bf16 grows with width (AVX2)."""
    monkeypatch.chdir(tmp_path)
    here = hardware.hardware_slug(torch.device("cpu"))
    folder = tmp_path / "profiles" / here
    folder.mkdir(parents=True)

    def write(fp32, bf16):
        for dt, ms in (("float32", fp32), ("bfloat16", bf16)):
            (folder / f"mymodel-{dt}.yaml").write_text(_profile(here, {}, dt, ms).to_yaml())

    write([38.0, 43.4, 36.8, 42.8, 51.4], [35.1, 35.3, 37.7, 41.2, 48.1])  # Zen 4 EPYC (benchmarks/RESULTS-cpu.md)
    dtype, why = models.auto_dtype("mymodel", CPU)
    assert dtype == torch.bfloat16 and "measured on" in why
    write([48.7, 56.8, 61.4, 68.6, 87.3], [36.4, 55.2, 89.8, 148.0, 263.0])  # AVX2 EPYC
    assert models.auto_dtype("mymodel", CPU)[0] == torch.float32
    assert models.auto_dtype("other-model", CPU) == (torch.float32, models.auto_dtype("other-model", CPU)[1])
    assert "no float32 + bfloat16 profiles" in models.auto_dtype("other-model", CPU)[1]


def test_auto_dtype_on_a_gpu_follows_its_profiles_too(tmp_path, monkeypatch):
    """On a GPU --dtype auto is bfloat16 until this GPU has both profiles; then the faster one, as on a CPU (the
    H200's made it float32: its bf16 decoding ran 1.7x slower, benchmarks/RESULTS-gpu.md). Only the CUDA facts are
    faked: the hardware key and bf16 support."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hardware, "hardware_slug", lambda device: "nvidia-fake")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    gpu = torch.device("cuda", 0)
    dtype, why = models.auto_dtype("mymodel", gpu)
    assert dtype == torch.bfloat16 and "no float32 + bfloat16 profiles of mymodel for nvidia-fake" in why
    folder = tmp_path / "profiles" / "nvidia-fake"
    folder.mkdir(parents=True)
    for dt, ms in (("float32", [18.4, 19.2, 19.3, 18.6, 19.4]), ("bfloat16", [18.8, 23.0, 29.6, 39.7, 38.0])):
        (folder / f"mymodel-{dt}.yaml").write_text(_profile("nvidia-fake", {}, dt, ms).to_yaml())
    dtype, why = models.auto_dtype("mymodel", gpu)
    assert dtype == torch.float32 and "measured on nvidia-fake" in why
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # an older GPU: float16
    assert models.auto_dtype("mymodel", gpu)[0] == torch.float16  # no float16 profile: its fallback


def test_shipped_profiles_and_trees_carry_their_identity():
    from specbench import REPO_ROOT

    for path in (REPO_ROOT / "profiles").glob("cpu-*/*.yaml"):
        data = yaml.safe_load(path.read_text())
        assert data["hardware"] == path.parent.name == slug_of(data["identity"]), path
    for path in (REPO_ROOT / "trees").glob("*/cpu-*.yaml"):
        data = yaml.safe_load(path.read_text())
        assert path.stem.startswith(data["hardware"]), path


def test_a_tree_built_for_other_hardware_is_labelled_borrowed(tmp_path, monkeypatch):
    from specbench.core.tree_file import TreeFile, TreeSpec, resolve_tree
    from specbench.planning.tree_choice import choose

    monkeypatch.chdir(tmp_path)
    tree = TreeFile({1: [((0,), 1)]}, 1, model="m", hardware=slug_of(AVX2_EPYC), dtype="float32")
    folder = tmp_path / "trees" / "m"
    tree.write(folder / f"{slug_of(AVX2_EPYC)}-float32.yaml")

    def build(size):  # the fallback when no tree file fits
        return TreeFile({1: []}, 1)

    _, source = resolve_tree(TreeSpec.parse(str(folder / f"{slug_of(AVX2_EPYC)}-float32.yaml")), slug_of(ZEN4_EPYC),
                             build)
    assert f"built for {slug_of(AVX2_EPYC)}" in source and "borrowed" in source
    mine = choose("m", "ppd", slug_of(AVX2_EPYC), "float32", one_state=False, rows=1)  # --tree auto's choice
    assert mine.tree is not None and "borrowed" not in mine.source
    other = choose("m", "ppd", slug_of(ZEN4_EPYC), "float32", one_state=False, rows=1)  # never the AVX2 tree
    assert other.tree is None
    fallback = other.fallback_source(16)  # what a run says it decodes with instead
    assert fallback.startswith("built, size 16") and "trees for other hardware" in fallback

"""llama.cpp's files and machine facts (backends/llama_cpp.py runs it): llama-cpp-python itself or the
command that installs it, the GGUF a --model / --draft-model names, whether llama.cpp's extra weight buffers run on
this machine (a probe in a child process), and a GGUF's weight type by llama.cpp's name."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import SpecbenchError
from ..progress import console, status

PIP = "pip install 'specbench[llamacpp]'"
CPU = torch.device("cpu")  # where llama.cpp runs here (in this process)


def import_llama_cpp():
    """llama_cpp, or the exact command that installs it."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise SpecbenchError(f"--engine llama.cpp needs llama-cpp-python (not installed: {exc.name or exc}). Install "
                             f"it with: {PIP}  (it builds llama.cpp from source: minutes)") from None
    return llama_cpp


def gguf_file(spec: str, flag: str) -> Path:
    """The GGUF a --model / --draft-model names: `smollm2-135m` is the embedded default's GGUF as shipped."""
    from ..core.model.naming import EMBEDDED_ALIAS

    if spec == EMBEDDED_ALIAS:
        from ..core.model.gguf import embedded_gguf_path

        return embedded_gguf_path()
    path = Path(spec).expanduser()
    if not path.is_file():
        why = "no such file" if not path.exists() else "a folder, not a GGUF file"
        hint = (" (a specbench drafter artefact becomes a GGUF with llama.cpp's converter: docs/engines.md)"
                if (path / "drafter.yaml").exists() else "")
        alt = f" (or {EMBEDDED_ALIAS}, the embedded model's GGUF)" if flag == "--model" else ""
        raise SpecbenchError(f"{flag} {spec}: {why}{hint}. --engine llama.cpp reads GGUF files: pass {flag} "
                             f"FILE.gguf{alt}")
    with path.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise SpecbenchError(f"{flag} {spec}: not a GGUF file (no GGUF header). --engine llama.cpp reads GGUF "
                                 "files; convert a Hugging Face model with llama.cpp's convert_hf_to_gguf.py "
                                 "(docs/engines.md)")
    return path


# a child process loads the GGUF with llama.cpp's extra weight buffers and decodes a few tokens: on some CPUs these
# kernels crash the process (a natively built llama-cpp-python on an AMX Xeon: SIGSEGV in
# ggml_backend_amx_mul_mat), which no Python code can catch
PROBE = """
import sys, llama_cpp
from specbench.backends.llama_hooks import MeteredLlama
llm = MeteredLlama(sys.argv[1], n_ctx=64, n_threads=int(sys.argv[2]), verbose=False, extra_bufts=True)
stream = llm.generate(llm.tokenize(b"One, two, three, four,", add_bos=False), temp=0.0)
for _, _ in zip(range(3), stream):
    pass
"""


def extra_buffers_work(path: Path, threads: int) -> tuple[bool, str]:
    """Whether llama.cpp's extra weight buffers (AMX, repacked layouts) run this GGUF on this machine, and why:
    SPECBENCH_LLAMA_EXTRA_BUFFERS=1/0 decides, else a probe in a child process (PROBE), cached per llama-cpp-python
    version, hardware and weight file (name, size)."""
    import json
    import os
    import subprocess
    import sys

    import llama_cpp

    from ..core import store
    from ..core.machine.hardware import hardware_slug

    forced = os.environ.get("SPECBENCH_LLAMA_EXTRA_BUFFERS")
    if forced in ("0", "1"):
        return forced == "1", f"SPECBENCH_LLAMA_EXTRA_BUFFERS={forced}"
    key = f"{llama_cpp.__version__}-{hardware_slug(CPU)}-{path.name}-{path.stat().st_size}"
    cache = store.user_cache() / "engines" / "llama_cpp_extra_buffers.json"
    known = json.loads(cache.read_text()) if cache.exists() else {}
    if key not in known:
        with status("Checking llama.cpp's extra weight buffers on this machine (once per model)"):
            done = subprocess.run([sys.executable, "-c", PROBE, str(path), str(threads)], capture_output=True,
                                  timeout=600)
        known[key] = done.returncode >= 0  # killed by a signal (SIGSEGV): off; any other failure: the load says why
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(known, indent=1))
    if known[key]:
        return True, "a probe decoded with them on this machine"
    return False, ("a probe crashed with them on this machine (cached in "
                   f"{cache}); set SPECBENCH_LLAMA_EXTRA_BUFFERS=1 to force them")


def ftype_name(llama_cpp, ftype: int) -> str:
    """llama.cpp's file type as a name ("Q4_1", "F16", ...), from its own LLAMA_FTYPE_* constants."""
    for name in dir(llama_cpp):
        if name.startswith("LLAMA_FTYPE_") and getattr(llama_cpp, name) == ftype and name != "LLAMA_FTYPE_GUESSED":
            return name.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_").removeprefix("ALL_")
    return f"ftype-{ftype}"

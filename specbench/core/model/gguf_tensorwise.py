"""De-quantise a GGUF tensor by tensor straight into the run's dtype: peak memory near the model's size in that dtype.

transformers' GGUF loader de-quantises every tensor to float32 numpy, keeps them all in one state dict, then builds the
model and copies them in: several times the bf16 size at the peak (benchmarks/RESULTS-cpu.md). Here the model
is built first with its storage left uninitialised (pages become resident only as they are written), then each GGUF
tensor is de-quantised (float32, a block of rows at a time where no processor needs the whole tensor) and copied into
its parameter, converting to the dtype on the way; the float32 scratch of one block is all that is held beside the
model. The GGUF -> transformers name map and the per-architecture tensor fix-ups (llama's q/k row permutation) are
transformers' own (modeling_gguf_pytorch_utils), so the weights are the same as its loader's.
"""

from __future__ import annotations

from pathlib import Path

import torch

ROWS_BYTES = 8 * 2**20  # float32 rows de-quantised at a time (the de-quantiser's temporaries are a few times this)


def supported(architecture: str) -> bool:
    """Whether this GGUF architecture's tensor processor maps one tensor to one parameter (no merging across tensors,
    as the MoE processors do): only those are loaded here; others go through transformers' loader."""
    from transformers import modeling_gguf_pytorch_utils as mg

    cls = mg.TENSOR_PROCESSORS.get(architecture, mg.TensorProcessor)
    simple = {mg.TensorProcessor, mg.LlamaTensorProcessor, mg.NemotronTensorProcessor, mg.Gemma2TensorProcessor}
    return cls in simple


def architecture(path: Path) -> str:
    """general.architecture from the GGUF header, read directly: gguf.GGUFReader parses every field (the tokenizer's
    tens of thousands of strings, held while it lives), and this is asked before any loading."""
    import struct

    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type -> bytes
    with path.open("rb") as fh:
        def read(fmt: str):
            return struct.unpack("<" + fmt, fh.read(struct.calcsize(fmt)))[0]

        def string() -> bytes:
            return fh.read(read("Q"))

        def skip(kind: int) -> None:
            if kind == 8:
                string()
            elif kind == 9:
                sub, count = read("I"), read("Q")
                if sub in scalar:
                    fh.seek(scalar[sub] * count, 1)
                else:
                    for _ in range(count):
                        skip(sub)
            else:
                fh.seek(scalar[kind], 1)

        if fh.read(4) != b"GGUF":
            raise ValueError(f"{path.name} is not a GGUF file")
        read("I"), read("Q")  # version, tensor count
        for _ in range(read("Q")):
            key, kind = string(), read("I")
            if key == b"general.architecture" and kind == 8:
                return string().decode()
            skip(kind)
    raise ValueError(f"{path.name} names no general.architecture")


def _whole(name: str) -> bool:
    """Tensors a processor rearranges across rows (llama's q/k heads) or changes (Gemma's norms): de-quantised whole,
    not in row blocks."""
    return ".attn_q." in name or ".attn_k." in name or "norm" in name


def dequantised_model(path: Path, config, dtype: torch.dtype, attention: str):
    """The GGUF's causal LM in `dtype` on the CPU, its parameters filled tensor by tensor. Raises ValueError naming
    a parameter the file does not hold (then the caller's loader says what is wrong)."""
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM
    from transformers import modeling_gguf_pytorch_utils as mg
    from transformers.initialization import no_init_weights

    # the tensors' names, types, shapes and offsets; the reader's parsed fields (the tokenizer's many strings) are
    # let go at once, and the bytes are read from the file tensor by tensor (_read_rows)
    tensors = GGUFReader(str(path)).tensors
    arch = architecture(path)
    with no_init_weights():  # torch.empty storage: nothing resident until written below
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
    processor = mg.TENSOR_PROCESSORS.get(arch, mg.TensorProcessor)(config=config.to_dict())
    names = mg.get_gguf_hf_weights_map(model, processor)
    params = dict(model.named_parameters(remove_duplicate=False))
    filled: set[int] = set()
    with path.open("rb") as fh:
        for tensor in tensors:
            target = _fill(fh, tensor, processor, names, params)
            if target is not None:
                filled.add(target.data_ptr())
    missing = [n for n, p in params.items() if p.data_ptr() not in filled]
    if missing and _tied_head(model, config, missing):  # no output tensor in the file: the head is the embedding
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
        missing = [n for n in missing if n != _head_name(model)]
    if missing:
        raise ValueError(f"the GGUF file holds no tensor for {missing[0]}" +
                         (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return model


def _head_name(model) -> str:
    head = model.get_output_embeddings()
    return next(name for name, module in model.named_modules() if module is head) + ".weight"


def _tied_head(model, config, missing: list[str]) -> bool:
    """Whether the file ties its output head to the token embeddings: transformers' GGUF config says so when the
    file holds no output tensor (llama.cpp writes tied models without one), and the head is all that is missing."""
    head = model.get_output_embeddings()
    return (bool(getattr(config, "tie_word_embeddings", False)) and head is not None
            and _head_name(model) in missing and head.weight.shape == model.get_input_embeddings().weight.shape)


def _read_rows(fh, tensor, start: int, stop: int):
    """Rows start..stop of a GGUF tensor's stored blocks ([rows, bytes or values per row], its stored dtype), read
    from the file rather than through the reader's memory map: mapped pages would stay in the process's resident
    set (a whole file's worth by the end), read ones are let go once de-quantised."""
    import numpy as np

    data = tensor.data  # the reader's memory-mapped view: its shape and dtype only, no page touched
    if data.ndim == 1:
        fh.seek(int(tensor.data_offset))
        return np.frombuffer(fh.read(data.nbytes), dtype=data.dtype)
    per_row = data[0].nbytes
    fh.seek(int(tensor.data_offset) + start * per_row)
    raw = np.frombuffer(fh.read((stop - start) * per_row), dtype=data.dtype)
    return raw.reshape(stop - start, *data.shape[1:])


def _fill(fh, tensor, processor, names: dict, params: dict):
    """De-quantise one GGUF tensor into its parameter (in row blocks where no processor needs it whole); returns the
    parameter's tensor, or None for a tensor the model has no parameter for."""
    import numpy as np
    from gguf import dequantize

    shape = tuple(int(v) for v in reversed(tensor.shape))  # GGUF lists dims innermost first
    rows = tensor.data.shape[0] if tensor.data.ndim > 1 else 0
    if rows and len(shape) == 2 and not _whole(tensor.name):
        name = names.get(processor.process(weights=None, name=tensor.name, tensor_key_mapping=names,
                                           parsed_parameters={}).name)
        if name not in params:
            return None
        target = params[name].data
        step = max(1, ROWS_BYTES // (4 * shape[1]))
        for start in range(0, rows, step):  # [step, columns] float32 at a time
            block = dequantize(_read_rows(fh, tensor, start, min(start + step, rows)), tensor.tensor_type)
            if not block.flags.writeable:  # an unquantised type comes back as a read-only view of the bytes read
                block = block.copy()
            target[start:start + step].copy_(torch.from_numpy(np.ascontiguousarray(block)).view(-1, shape[1]))
        return target
    weights = dequantize(_read_rows(fh, tensor, 0, rows), tensor.tensor_type)
    result = processor.process(weights=weights, name=tensor.name, tensor_key_mapping=names, parsed_parameters={})
    name = names.get(result.name)
    if name not in params:
        return None
    target = params[name].data
    target.copy_(torch.from_numpy(np.array(result.weights)).reshape(target.shape))
    return target

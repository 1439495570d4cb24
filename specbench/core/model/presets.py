"""The shipped table of model shapes `--model random:NAME` builds: published configurations, each with the file it
comes from, so a 7B-70B target can be profiled, fitted and planned for without its weights (latency and memory
depend on the shape, not on the values).

Each entry is the architecture part of the model's own config.json (the fields that set shapes, attention and
position encoding); `source` names that file. `tiny` is for tests (byte-level tokenizer, builds in milliseconds).
"""

from __future__ import annotations

_LLAMA = dict(model_type="llama", hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=False)
_LLAMA31_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=8192)
_QWEN2 = dict(model_type="qwen2", hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0)

# name -> (source, config fields). Sources are Hugging Face model repositories' config.json files.
PUBLISHED: dict[str, tuple[str, dict]] = {
    "tiny": ("specbench test model (not published)",
             dict(_LLAMA, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=260, max_position_embeddings=512)),
    "smollm2-135m": ("HuggingFaceTB/SmolLM2-135M-Instruct config.json",
                     dict(_LLAMA, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                          max_position_embeddings=8192, tie_word_embeddings=True, rope_theta=100000.0)),
    "qwen2.5-0.5b": ("Qwen/Qwen2.5-0.5B config.json",
                     dict(_QWEN2, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                          max_position_embeddings=32768, tie_word_embeddings=True)),
    "qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B config.json",
                     dict(_QWEN2, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                          num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                          max_position_embeddings=131072, tie_word_embeddings=True)),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B config.json",
                   dict(_QWEN2, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                        max_position_embeddings=131072, tie_word_embeddings=False)),
    "vicuna-7b": ("lmsys/vicuna-7b-v1.3 config.json (LLaMA-1 7B shape; the PPD, Medusa, EAGLE and ParallelSpec "
                  "papers' Vicuna-7B)",
                  dict(_LLAMA, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                       max_position_embeddings=2048, rms_norm_eps=1e-6)),
    "vicuna-13b": ("lmsys/vicuna-13b-v1.3 config.json (LLaMA-1 13B shape)",
                   dict(_LLAMA, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                        num_attention_heads=40, num_key_value_heads=40, vocab_size=32000,
                        max_position_embeddings=2048, rms_norm_eps=1e-6)),
    "llama2-7b": ("meta-llama/Llama-2-7b-hf config.json",
                  dict(_LLAMA, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                       max_position_embeddings=4096)),
    "llama2-13b": ("meta-llama/Llama-2-13b-hf config.json",
                   dict(_LLAMA, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                        num_attention_heads=40, num_key_value_heads=40, vocab_size=32000,
                        max_position_embeddings=4096)),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B config.json",
                     dict(_LLAMA, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                          max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=dict(_LLAMA31_ROPE))),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B config.json",
                      dict(_LLAMA, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                           num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
                           max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=dict(_LLAMA31_ROPE))),
    "mistral-7b": ("mistralai/Mistral-7B-v0.1 config.json",
                   dict(model_type="mistral", hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=False,
                        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768,
                        rope_theta=10000.0, sliding_window=4096)),
}


def parameter_count(cfg: dict) -> int:
    """Weights of a decoder-only config (embeddings, attention, MLP, norms, LM head unless tied; Qwen2's q/k/v
    biases), from its fields alone: what the shape costs before anything is built."""
    h, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or h // heads
    kv = cfg.get("num_key_value_heads") or heads
    attn = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    if cfg.get("model_type") == "qwen2":
        attn += heads * head_dim + 2 * kv * head_dim  # q, k and v biases
    per_layer = attn + 3 * h * cfg["intermediate_size"] + 2 * h  # + two RMSNorm weights
    head = 0 if cfg.get("tie_word_embeddings") else vocab * h
    return layers * per_layer + vocab * h + head + h

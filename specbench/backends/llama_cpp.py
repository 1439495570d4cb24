"""--engine llama.cpp: llama-cpp-python in process, its own decoding beside specbench's methods.

  ar   llama.cpp's plain generation (Llama.generate, greedy at --temperature 0)
  pld  its prompt lookup (llama_speculative.LlamaPromptLookupDecoding as Llama's draft_model): --pld-ngram is its
       max_ngram_size, --pld-draft-tokens its num_pred_tokens
  sd   a second GGUF (--draft-model) as its draft model (llama_hooks.GreedyDraft, --gamma tokens per proposal)

Each method has its own Llama over the same mmap'd weights (a draft_model makes llama.cpp keep every position's
logits, logits_all, which costs ar nothing when ar has its own). Prompts are the run's datasets rendered with the
GGUF's own chat template (the template specbench's tokenizer takes from the same file for the embedded model) and
tokenized by llama.cpp. Methods run interleaved per prompt, every turn from a fresh context (no prompt cache), after
--warmup untimed generations; tau and acceptance come from the engine's own hooks (llama_hooks.py), per-token times
from its token stream. It is a backend of specbench's runner (run/backend.py: `check`, `prepare`, `LlamaCpp`), so
resume, --retime, the noise guard, records and the lossless check are the runner's, as for specbench's own methods.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from rich.markup import escape

from ..data import datasets as ds
from ..errors import SpecbenchError
from ..progress import console, status
from ..methods.base import Generation
from ..run.backend import Measures, timed
from ..run.config import RunConfig
from ..run.work import fit_prompt
from .llama_files import extra_buffers_work, ftype_name, gguf_file, import_llama_cpp  # noqa: F401
from .common import check_methods, local_environment, near_tie

ENGINE = "llama.cpp"
SUPPORTED = ("ar", "pld", "sd")
SD_GAMMA = 5  # sd's draft length when --gamma is not given: llama.cpp's long-standing default n_draft
CONTEXT_MARGIN = 64  # tokens of room in each context beyond the longest planned conversation
CPU = torch.device("cpu")  # where llama.cpp runs here (in this process): peak memory is this process's RSS
# a turn generated again from the same ids and seed gives the same tokens: --retime applies as to specbench's own
MEASURES = Measures(retime=True, resume=True, batches=False)


def check(cfg: RunConfig) -> RunConfig:
    """What llama.cpp cannot run, refused before anything is written: methods beyond ar / pld / sd, sd without a
    draft GGUF, files that are not GGUFs, the extra not installed; `ar` first in the method list."""
    cfg = check_methods(cfg, SUPPORTED, ENGINE)
    if "sd" in cfg.methods and not cfg.drafter:
        raise SpecbenchError("-m sd under --engine llama.cpp needs --draft-model SMALL.gguf (a GGUF with the target's "
                             "vocabulary); for the embedded model, docs/engines.md shows how to make one from the "
                             "shipped drafter")
    if cfg.drafter and "sd" not in cfg.methods:
        console.print(f"[yellow]note[/] --draft-model {escape(cfg.drafter)} is only used by -m sd: ignored")
    import_llama_cpp()
    gguf_file(cfg.model, "--model")
    if "sd" in cfg.methods:
        gguf_file(cfg.drafter, "--draft-model")
    return cfg


def prepare(cfg: RunConfig, loaded) -> "LlamaCpp":
    """The GGUF(s) loaded, one Llama per method."""
    draft = gguf_file(cfg.drafter, "--draft-model") if "sd" in cfg.methods else None
    return LlamaCpp(cfg, gguf_file(cfg.model, "--model"), draft, loaded)


class LlamaCpp:
    """The backend of `--engine llama.cpp` (run/backend.py): the loaded GGUF(s), one MeteredLlama per method, the
    prompt rendering, timed turns and the lossless explanation (ar's logits at a divergence)."""

    measures = MEASURES

    def __init__(self, cfg: RunConfig, target: Path, draft: Path | None, loaded):
        import llama_cpp

        from .llama_hooks import GreedyDraft, MeteredDraft, MeteredLlama

        self.cfg, self.target_path, self.draft_path = cfg, target, draft
        self.labels, self.model_spec = tuple(cfg.methods), cfg.model
        self.threads = cfg.threads or torch.get_num_threads()  # specbench's own default: torch's thread count
        options = cfg.method_options()
        pld = options.get("pld", {})
        self.ngram, self.pld_tokens = pld.get("pld_ngram", 3), pld.get("pld_draft_tokens", 10)
        self.gamma = options.get("sd", {}).get("gamma") or SD_GAMMA
        self.extra, self.extra_why = extra_buffers_work(target, self.threads)
        if draft is not None and self.extra:  # one setting for both models: the draft's file is probed too
            self.extra, self.extra_why = extra_buffers_work(draft, self.threads)
        if not self.extra:
            console.print("[yellow]note[/] llama.cpp runs without its extra weight buffers (AMX / repacked kernels: "
                          f"--no-repack): {escape(self.extra_why)}. run.yaml's engine block says so.")
        from llama_cpp._utils import suppress_stdout_stderr

        with suppress_stdout_stderr(disable=False):  # a vocab-only context warns that it has no trained context
            vocab = self._load(MeteredLlama, target, "--model", n_ctx=64, vocab_only=True)  # rendering, sizes
        self.vocab = vocab
        meta, arch = vocab.metadata, vocab.metadata.get("general.architecture", "llama")
        self.n_ctx_train = int(meta.get(f"{arch}.context_length") or 2048)  # a vocab-only model reports 0 itself
        self.template = meta.get("tokenizer.chat_template")
        self.layers = int(meta.get(f"{arch}.block_count") or 30)
        n_ctx = self._context_size(loaded)
        self.llms = {}
        for method in cfg.methods:
            if method == "ar":
                self.llms[method] = self._load(MeteredLlama, target, "--model", n_ctx=n_ctx)
                continue
            llm = self._load(MeteredLlama, target, "--model", n_ctx=n_ctx, logits_all=True)
            if method == "pld":
                inner = llama_cpp.llama_speculative.LlamaPromptLookupDecoding(max_ngram_size=self.ngram,
                                                                              num_pred_tokens=self.pld_tokens)
            else:
                self.draft_llm = self._load(MeteredLlama, draft, "--draft-model", n_ctx=n_ctx)
                if self.draft_llm.n_vocab() != llm.n_vocab():
                    raise SpecbenchError(f"--draft-model {draft}: its vocabulary ({self.draft_llm.n_vocab()} tokens) "
                                         f"is not the target's ({llm.n_vocab()}): a draft model must share the "
                                         "target's tokenizer")
                inner = GreedyDraft(self.draft_llm, self.gamma)
            llm.draft_model = MeteredDraft(inner, llm.meter)
            self.llms[method] = llm
        self.weight_type = ftype_name(llama_cpp, llama_cpp.llama_model_ftype(self.llms["ar"].model))
        self.env = local_environment(ENGINE, self.threads, self.weight_type)
        self.env["engine_version"] = llama_cpp.__version__

    def _load(self, cls, path: Path, flag: str, **kwargs):
        try:
            return cls(str(path), n_threads=self.threads, n_threads_batch=self.threads, verbose=False,
                       extra_bufts=self.extra, **kwargs)
        except (ValueError, RuntimeError, OSError) as exc:
            raise SpecbenchError(f"{flag} {path}: llama.cpp could not load this GGUF ({exc}). Check that the file is "
                                 "complete and of an architecture the installed llama-cpp-python supports") from None

    def _context_size(self, loaded) -> int:
        """Room for the longest planned conversation (every turn's prompt plus --max-new-tokens per turn and a
        draft's look-ahead), within the model's trained context: each method's context (and, with a draft model,
        its all-positions logits buffer, n_ctx x vocab floats) stays as small as the run needs."""
        need = 0
        for d in loaded:
            for p in d.prompts:
                msgs = ds.conversation(p, len(p.turns) - 1, [""] * (len(p.turns) - 1))
                need = max(need, len(self.render(msgs)) + len(p.turns) * self.cfg.max_new_tokens)
        look_ahead = max(self.pld_tokens, self.gamma) + 1
        return min(self.n_ctx_train, need + look_ahead + CONTEXT_MARGIN)

    # ------------------------------------------------------------------------------------------------- prompts

    def render(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation, as specbench's Tokenizer.render does it: the chat template (here the GGUF's
        own, rendered by llama-cpp-python's Jinja2ChatFormatter, which follows transformers' template settings)
        up to the assistant's reply, tokenized without added special tokens; without a template the turns as plain
        text with the tokenizer's own BOS."""
        vocab = self.vocab
        if self.template:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            special = lambda tid: vocab.detokenize([tid], special=True).decode("utf-8", "replace") if tid >= 0 else ""
            text = Jinja2ChatFormatter(self.template, eos_token=special(vocab.token_eos()),
                                       bos_token=special(vocab.token_bos()))(messages=messages).prompt
            return vocab.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        text = "\n\n".join(m["content"] for m in messages)
        return vocab.tokenize(text.encode("utf-8"), add_bos=True, special=False)

    def prompt_ids(self, messages: list[dict], prompt: ds.Prompt) -> tuple[list[int], int] | None:
        """Rendered and fitted into the trained context as specbench's own backend does (left-truncated with a
        warning, or None: skipped), with the tokens cut."""
        rendered = self.render(messages)
        ids = fit_prompt(rendered, self.n_ctx_train, self.cfg.max_new_tokens, prompt.id)
        return None if ids is None else (ids, len(rendered) - len(ids))

    def decode(self, tokens: list[int]) -> str:
        return self.vocab.detokenize(tokens).decode("utf-8", "replace")

    # --------------------------------------------------------------------------------------------- generation

    def generate(self, label: str, ids: list[int], seed: int) -> tuple[Generation, float, float]:
        """One timed turn (run/backend.timed: the median of --repeats, this process's peak memory)."""
        return timed(lambda: self.generate_once(label, ids, self.cfg.max_new_tokens, seed), self.cfg.repeats, CPU)

    def generate_once(self, label: str, ids: list[int], max_new_tokens: int, seed: int = 0) -> Generation:
        """One generation from a fresh context; each token's arrival time from llama.cpp's stream (seconds from
        the prompt's evaluation); counts from the hooks (llama_hooks.tally)."""
        from .llama_hooks import tally

        llm = self.llms[label]
        if getattr(llm, "draft_model", None) is not None and label == "sd":
            self.draft_llm.reset()  # the draft starts cold too (no prompt cached from another turn)
            self.draft_llm.meter.clear()
        llm.reset()  # no prompt cache: every method prefills the whole prompt
        llm.meter.clear()
        cfg = self.cfg
        sampling = dict(temp=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, min_p=0.0, repeat_penalty=1.0)
        if cfg.temperature > 0:
            llm.set_seed(seed)
        gen = Generation()
        emitted = []
        start = time.perf_counter()
        stream = llm.generate(ids, **sampling)
        for tok in stream:
            gen.token_times.append(time.perf_counter() - start)
            gen.tokens.append(int(tok))
            emitted.append((int(tok), len(llm.meter.fed) - 1))
            if llm.is_eog(tok):
                gen.stopped = True
                break
            if len(gen.tokens) >= max_new_tokens:
                break
        stream.close()
        counts = tally(llm.meter.fed, emitted)
        gen.target_forwards, gen.drafted, gen.accepted_drafts = counts.forwards, counts.drafted, counts.accepted
        gen.drafted_per_position = counts.drafted_per_position
        gen.accepted_per_position = counts.accepted_per_position
        gen.draft_forwards = len(self.draft_llm.meter.fed) if label == "sd" else 0
        gen.draft_s, gen.forward_s = llm.meter.draft_s, llm.meter.forward_s
        return gen

    def reference(self, label: str, ids: list[int]) -> None:
        return None  # batch-1 `ar` is the only reference

    def warm_up(self, prompts: list[ds.Prompt], batch_labels=(), batch_sizes=(), out=None) -> None:
        """--warmup untimed generations per method (up to 32 tokens) on the first prompt."""
        if not prompts or self.cfg.warmup == 0:
            return
        fitted = self.prompt_ids(ds.conversation(prompts[0], 0, []), prompts[0])
        if fitted is None:
            return
        with status("Warming up llama.cpp (not timed)"):
            for label in self.llms:
                for _ in range(self.cfg.warmup):
                    self.generate_once(label, fitted[0], min(self.cfg.max_new_tokens, 32))

    def close(self, out) -> None:
        pass

    # ----------------------------------------------------------------------------------------------- lossless

    def ar_logits(self, ids: list[int], ar_tokens: list[int], index: int):
        """ar's logits before its token `index`, replayed exactly as ar computed them (the prompt in one
        evaluation, then one token at a time on ar's own Llama): [vocab] float32."""
        import numpy as np

        llm = self.llms["ar"]
        llm.reset()
        llm.eval(ids)
        for tok in ar_tokens[:index]:
            llm.eval([tok])
        return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),)).copy()

    def explain(self, ids: list[int], ar_tokens: list[int], tokens: list[int], index: int) -> tuple[float, str]:
        """(gap, verdict) at a method's first divergence from ar, from ar's logits there (common.near_tie)."""
        if index >= len(ar_tokens) or index >= len(tokens):
            return math.nan, "unexplained"  # a length difference: no token to compare
        return near_tie(self.ar_logits(ids, ar_tokens, index), ar_tokens[index], tokens[index], self.layers)

    # ------------------------------------------------------------------------------------------------ run.yaml

    def model_block(self) -> dict:
        return {"spec": self.cfg.model, "name": self.vocab.metadata.get("general.name") or self.target_path.stem,
                "source": str(self.target_path), "rendering": "chat template" if self.template else "plain text",
                "placement": f"{ENGINE}:cpu", "weights": self.weight_type}

    def facts(self) -> dict:
        """run.yaml's engine block: name, version and how this llama.cpp was built."""
        import llama_cpp

        info = llama_cpp.llama_print_system_info()
        return {"name": ENGINE, "package": "llama-cpp-python", "version": llama_cpp.__version__,
                "build": {"system_info": (info.decode() if isinstance(info, bytes) else str(info)).strip(" |"),
                          "threads": self.threads, "weights": self.weight_type,
                          "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()),
                          "extra_buffers": self.extra, "extra_buffers_why": self.extra_why},
                "draft_model": str(self.draft_path) if self.draft_path else None}

    def profile(self):
        return None  # no latency profile of a GGUF: the noise guard's floor stays 1.0

    def run_blocks(self, loaded) -> dict:
        """run.yaml's model, engine, chosen and peak-memory blocks."""
        return {"model": self.model_block(), "engine": self.facts(), "chosen": self.chosen(),
                "peak_memory": "peak RSS during the generation (llama.cpp runs in this process)"}

    def chosen(self) -> dict:
        """What each method ran with, in llama.cpp's own terms."""
        out = {}
        if "pld" in self.llms:
            out["pld"] = {"engine": "LlamaPromptLookupDecoding", "max_ngram_size": self.ngram,
                          "num_pred_tokens": self.pld_tokens}
        if "sd" in self.llms:
            out["sd"] = {"engine": "draft_model (greedy second GGUF)", "gamma": self.gamma,
                         "draft_model": str(self.draft_path)}
        return out

"""--engine llama.cpp: llama-cpp-python in process, its own decoding beside specbench's methods.

  ar   the engine's plain generation (Llama.generate, greedy at --temperature 0)
  pld  its prompt lookup (llama_speculative.LlamaPromptLookupDecoding as Llama's draft_model): --pld-ngram is its
       max_ngram_size, --pld-draft-tokens its num_pred_tokens
  sd   a second GGUF (--draft-model) as its draft model (llama_hooks.GreedyDraft, --gamma tokens per proposal)

Each method has its own Llama over the same mmap'd weights (a draft_model makes the engine keep every position's
logits, logits_all, which costs ar nothing when ar has its own). Prompts are the run's datasets rendered with the
GGUF's own chat template (the template specbench's tokenizer takes from the same file for the embedded model) and
tokenized by llama.cpp. Methods run interleaved per prompt, every turn from a fresh context (no prompt cache), after
--warmup untimed generations; tau and acceptance come from the engine's own hooks (llama_hooks.py), per-token times
from its token stream, the lossless check from common.EngineRun.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from rich.markup import escape

from ..core.machine import contention, memory
from ..data import datasets as ds
from ..errors import SpecbenchError
from ..progress import console, progress_bar, status
from ..run.config import RunConfig
from ..run.work import PromptWork, fit_prompt
from .llama_files import extra_buffers_work, ftype_name, gguf_file, import_engine  # noqa: F401
from .common import EngineRun, EngineTurn, check_methods, load_work, local_environment, near_tie

ENGINE = "llama.cpp"
SUPPORTED = ("ar", "pld", "sd")
SD_GAMMA = 5  # sd's draft length when --gamma is not given: llama.cpp's long-standing default n_draft
CONTEXT_MARGIN = 64  # tokens of room in each context beyond the longest planned conversation
CPU = torch.device("cpu")  # where the engine runs here (in this process): peak memory is this process's RSS


def run(cfg: RunConfig) -> Path:
    """Run cfg's methods on llama.cpp and write the run folder (common.EngineRun); returns it."""
    cfg = check_methods(cfg, SUPPORTED, ENGINE)
    if "sd" in cfg.methods and not cfg.drafter:
        raise SpecbenchError("-m sd under --engine llama.cpp needs --draft-model SMALL.gguf (a GGUF with the target's "
                             "vocabulary); for the embedded model, docs/engines.md shows how to make one from the "
                             "shipped drafter")
    if cfg.drafter and "sd" not in cfg.methods:
        console.print(f"[yellow]note[/] --draft-model {escape(cfg.drafter)} is only used by -m sd: ignored")
    import_engine()
    target = gguf_file(cfg.model, "--model")
    draft = gguf_file(cfg.drafter, "--draft-model") if "sd" in cfg.methods else None
    loaded = load_work(cfg)
    engine = Engine(cfg, target, draft, loaded)
    run = EngineRun.open(cfg, loaded, engine.env, model=engine.model_block(), engine=engine.facts(),
                         chosen=engine.chosen())
    if run.nothing_left:
        return run.out
    work = run.pending()
    if len(run.done):
        console.print(f"{sum(len(w.labels) for w in work)} method x prompt results to go.")
    try:
        engine.warm_up(loaded[0].prompts)
        with progress_bar() as bar:
            task = bar.add_task("decoding", total=sum(len(w.labels) for w in work), info="")
            for w in work:
                results = {}
                for order, label in enumerate(w.labels):
                    bar.update(task, description=f"{w.dataset} {label} (llama.cpp)")
                    results[label] = engine.run_prompt(w.prompt, label, order)
                    n, s = sum(len(t.tokens) for t in results[label]), sum(t.wall_s for t in results[label])
                    bar.update(task, advance=1, info=f"{n / s if s else 0:6.1f} tok/s")
                run.finish_prompt(w, results, explain=engine.explainer(results, run.reference))
    except KeyboardInterrupt:
        raise run.interrupted() from None
    return run.complete()


class Engine:
    """The loaded GGUF(s): one MeteredLlama per method, the prompt rendering, timed turns and the lossless
    explanation (ar's logits at a divergence)."""

    def __init__(self, cfg: RunConfig, target: Path, draft: Path | None, loaded):
        import llama_cpp

        from .llama_hooks import GreedyDraft, MeteredDraft, MeteredLlama

        self.cfg, self.target_path, self.draft_path = cfg, target, draft
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

    def prompt_ids(self, messages: list[dict], prompt: ds.Prompt) -> list[int] | None:
        """Rendered and fitted into the trained context as specbench's runner does (left-truncated with a
        warning, or None: skipped)."""
        return fit_prompt(self.render(messages), self.n_ctx_train, self.cfg.max_new_tokens, prompt.id)

    # --------------------------------------------------------------------------------------------- generation

    def generate(self, label: str, ids: list[int], max_new_tokens: int) -> EngineTurn:
        """One generation from a fresh context, timed from the prompt's evaluation to the last token; each token's
        arrival time from the engine's stream; counts from the hooks (llama_hooks.tally)."""
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
            llm.set_seed(cfg.seed)
        tokens, times, emitted = [], [], []
        stopped = False
        memory.reset_peak(CPU)
        start = time.perf_counter()
        stream = llm.generate(ids, **sampling)
        for tok in stream:
            times.append(time.perf_counter() - start)
            tokens.append(int(tok))
            emitted.append((int(tok), len(llm.meter.fed) - 1))
            if llm.is_eog(tok):
                stopped = True
                break
            if len(tokens) >= max_new_tokens:
                break
        wall = time.perf_counter() - start
        stream.close()
        peak = memory.peak_mb(CPU)
        counts = tally(llm.meter.fed, emitted)
        draft_forwards = len(self.draft_llm.meter.fed) if label == "sd" else 0
        return EngineTurn(tokens=tokens, wall_s=wall, prompt_tokens=len(ids), token_times=times,
                          target_forwards=counts.forwards, drafted=counts.drafted, accepted=counts.accepted,
                          draft_forwards=draft_forwards, draft_s=llm.meter.draft_s, forward_s=llm.meter.forward_s,
                          drafted_per_position=counts.drafted_per_position,
                          accepted_per_position=counts.accepted_per_position, stopped=stopped, peak_mem_mb=peak,
                          prompt_ids=list(ids))

    def timed_turn(self, label: str, ids: list[int], turn: int, order: int) -> EngineTurn:
        """--repeats generations (the same tokens each time), the median-time one kept, with what else the machine
        did meanwhile (core/machine/contention.py)."""
        before = contention.snapshot()
        tries = [self.generate(label, ids, self.cfg.max_new_tokens) for _ in range(self.cfg.repeats)]
        noise = contention.between(before, contention.snapshot())
        kept = sorted(tries, key=lambda t: t.wall_s)[len(tries) // 2]
        kept.noise, kept.turn, kept.order = noise, turn, order
        kept.text = self.vocab.detokenize(kept.tokens).decode("utf-8", "replace")
        return kept

    def run_prompt(self, prompt: ds.Prompt, label: str, order: int) -> list[EngineTurn]:
        """Every turn of one prompt with one method (a later turn carries the method's own earlier answers)."""
        answers: list[str] = []
        out = []
        for turn in range(len(prompt.turns)):
            messages = ds.conversation(prompt, turn, answers)
            ids = self.prompt_ids(messages, prompt)
            if ids is None:
                break
            out.append(self.timed_turn(label, ids, turn, order))
            out[-1].prompt_cut = len(self.render(messages)) - len(ids)
            answers.append(out[-1].text)
        return out

    def warm_up(self, prompts: list[ds.Prompt]) -> None:
        """--warmup untimed generations per method (up to 32 tokens) on the first prompt."""
        if not prompts or self.cfg.warmup == 0:
            return
        ids = self.prompt_ids(ds.conversation(prompts[0], 0, []), prompts[0])
        if ids is None:
            return
        with status("Warming up llama.cpp (not timed)"):
            for label in self.llms:
                for _ in range(self.cfg.warmup):
                    self.generate(label, ids, min(self.cfg.max_new_tokens, 32))

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

    def explainer(self, results: dict[str, list[EngineTurn]], reference: dict):
        """common.Explain for one prompt: (gap, verdict) at a method's first divergence from ar, from ar's logits
        there; None when the turn's prompt is not ar's (an earlier turn diverged). reference: EngineRun.reference,
        ar's tokens by (dataset, prompt id, turn), a resumed run's earlier ones included (ar's prompt is then the
        method's own when every earlier turn of the method matched ar: the same conversation)."""
        def explain(label: str, work: PromptWork, t: EngineTurn, index: int):
            ar = {a.turn: a for a in results.get("ar", [])}
            if t.turn in ar:
                same_prompt = ar[t.turn].prompt_ids == t.prompt_ids
            else:
                earlier = [u for u in results.get(label, []) if u.turn < t.turn]
                same_prompt = all(u.tokens == reference.get((work.dataset, work.prompt.id, u.turn)) for u in earlier)
            ar_tokens = reference.get((work.dataset, work.prompt.id, t.turn))
            if not same_prompt or ar_tokens is None:
                return None
            if index >= len(ar_tokens) or index >= len(t.tokens):
                return math.nan, "unexplained"  # a length difference: no token to compare
            logits = self.ar_logits(t.prompt_ids, ar_tokens, index)
            return near_tie(logits, ar_tokens[index], t.tokens[index], self.layers)

        return explain

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

    def chosen(self) -> dict:
        """What each method ran with, in the engine's own terms."""
        out = {}
        if "pld" in self.llms:
            out["pld"] = {"engine": "LlamaPromptLookupDecoding", "max_ngram_size": self.ngram,
                          "num_pred_tokens": self.pld_tokens}
        if "sd" in self.llms:
            out["sd"] = {"engine": "draft_model (greedy second GGUF)", "gamma": self.gamma,
                         "draft_model": str(self.draft_path)}
        return out

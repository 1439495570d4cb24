"""`ppd`: Parallel Prompt Decoding (Chen et al. 2024, "Hardware-Aware Parallel Prompt Decoding for
Memory-Efficient Acceleration of LLM Inference", §3 and §4, Fig. 2-3).

Each step is one target forward over: the root (the last accepted token), a candidate tree whose tokens are the
top-k guesses of the previously accepted node's prompt tokens, and the prompt tokens attached to every node
(tree.py lays the input out and masks it). Verification walks the tree (exact match at T = 0; lossless
multi-candidate speculative sampling at T > 0, or typical acceptance for `ppd-typical`); the cache keeps only the
root and the accepted path; the accepted node's prompt-token logits give the next candidates, and how many prompt
tokens it carried is the next state of the dynamic sparse tree. Extra memory over `ar`: the S x EPT embeddings.
Counters: `drafted` counts the tree depth per step (the longest run that could be accepted).
"""

from __future__ import annotations

import torch
from rich.markup import escape

from ..core.cache import cache_length, keep_positions, new_cache
from ..core.hardware import hardware_slug
from ..core.models import dtype_name, model_slug
from ..core.ragged import Segment
from ..core.tree import (
    Tree,
    TreeFile,
    attention_mask,
    locate,
    position_ids,
    resolve_tree,
    visibility,
)
from ..core.verify import next_token, tree_speculative_accept, tree_typical_accept
from ..artifacts import prompt_tokens as pt
from ..errors import SpecbenchError
from ..planning.acceptance import GENERIC_PER_RANK, read_per_rank
from ..planning.treesearch import search
from ..progress import console
from .base import DecodeMethod, Generation, register
from .batch_loop import Batchable
from .options import ARTIFACT, TREE

DEFAULT_SIZE = 16
# One LM-head call over every tree input (nodes and all prompt inputs) instead of two (nodes, then the accepted
# node's prompt inputs) while the extra rows are few: a 49k-row fp32 head costs ~5 ms at 1 row and +0.35 ms per
# row on this 2-core CPU, so a second call loses once fewer than ~14 rows would be saved. GPUs are flatter still.
COMBINED_HEAD_MAX_PROMPT_INPUTS = 12


def searched_tree(acc: list[list[float]], m: int, size: int, model: str = "", source: str = "") -> TreeFile:
    """`--tree size=N` (and the default without a tree file): the dynamic sparse tree of size N found by
    build-tree's search (treesearch.search), so a size sweep measures the trees build-tree predicts for."""
    if size < 2:  # the search's own minimum: build-tree may choose any size it can search (2 on a steep curve)
        raise SpecbenchError(f"tree size {size} is too small: a candidate and its prompt token need at least 2")
    tree = search(acc, m, size)
    states = {k: list(zip(t.paths, t.prompt_tokens)) for k, t in tree.trees.items()}
    return TreeFile(states, m, model=model, built_by=f"dynamic sparse tree search at size {size} over "
                    f"{source or 'per-rank probabilities'}", predicted_tau=tree.tau)


class TreeLayout:
    """One state's tree with everything a step needs precomputed (mask part, positions, prompt rows)."""

    def __init__(self, tree: Tree, table: torch.Tensor, device):
        self.tree = tree
        self.parents = tree.parents
        self.visible = tree.visible(device)  # [q, q]
        self.offsets = tree.offsets(device)  # [q]
        self.rows = table[tree.prompt_rows()] if sum(tree.prompt_tokens) else None  # [P * E, H]
        self.max_rank = max((p[-1] for p in tree.paths), default=-1) + 1
        self.combined_head = self.visible.shape[0] - tree.nodes <= COMBINED_HEAD_MAX_PROMPT_INPUTS


@register
class ParallelPromptDecoding(Batchable, DecodeMethod):
    name = "ppd"
    kind = "tree"
    needs = ("target", "prompt tokens")
    summary = "parallel prompt decoding: trained prompt tokens guess a dynamic sparse tree, tree-verified"
    option_specs = (TREE, ARTIFACT)
    typical = False  # ppd-typical: Medusa's typical acceptance at T > 0 (lossy)

    family = "ppd"
    trainer = "ppd"

    def __init__(self, target, options=None, drafter=None):
        super().__init__(target, options, drafter)
        options = self.options
        device = target.device
        rows, ept, table, artifact = self._load_guesser()  # rows: token distances the guesses cover
        model_name = model_slug(target.spec)  # the file-name key every command uses (trees/, acceptance/)
        acc_path = locate(f"acceptance/{model_name}/{self.family}.yaml")
        acc = read_per_rank(acc_path, rows) if acc_path else GENERIC_PER_RANK[:rows]
        # where predicted tau comes from (run.yaml, report.md): this model's own estimate, or a generic table
        self.acceptance_source = str(acc_path) if acc_path else (
            f"a generic acceptance table, not {target.spec}'s (no acceptance/{model_name}/{self.family}.yaml: "
            f"`specbench estimate --method {self.family} --model {target.spec}` measures it)")
        said = f"generic_acceptance_said_{self.family}"
        if acc_path is None and not target.extras.get(said):  # once per model and method (tree sweeps)
            target.extras[said] = True
            console.print(f"[yellow]note[/] {self.name}: predicted tau and tree search use "
                          f"{escape(self.acceptance_source)}")

        def build(size: int) -> TreeFile:
            return self._searched_tree(acc, rows, size, model_name,
                                       str(acc_path) if acc_path else "a generic table")

        self.tree_file, self.tree_source = self._resolve_tree(build, model_name)
        self._check_tree(rows)
        self.m, self.ept = self.tree_file.prompt_tokens, ept
        self.layouts = self._make_layouts(table, ept, device)
        self.acceptance = acc  # per-rank probabilities (for predicted tau / speedup in reports)
        console.print(f"[dim]{self.name}: tree {escape(self.tree_source)} (size {self.tree_file.size}), "
                      f"{escape(artifact)}[/]")

    # what a tree method built on this engine supplies (medusa.py and hidden_transfer.py override these)

    def _load_guesser(self) -> tuple[int, int, torch.Tensor | None, str]:
        """Load the artefact: (token distances guessed, ensemble copies, embedding table [S * E, H] of the inputs
        attached to nodes or None, a description for the console)."""
        self.prompts = pt.resolve(self.options.artifact, self.target)
        table = self.prompts.table(self.target.dtype, self.target.device)  # [S * E, H]
        return self.prompts.count, self.prompts.ept, table, f"prompt tokens {self.prompts.source}"

    def _resolve_tree(self, build, model_name: str) -> tuple[TreeFile, str]:
        """--tree auto | PATH | size=N -> (tree file, where it came from)."""
        target = self.target
        return resolve_tree(self.options.tree, model_name, self.family, hardware_slug(target.device),
                            dtype_name(target.dtype), build, DEFAULT_SIZE, target.spec)

    def _searched_tree(self, acc, rows: int, size: int, model_name: str, source: str) -> TreeFile:
        return searched_tree(acc, rows, size, model_name, source)

    def _check_tree(self, rows: int) -> None:
        if self.tree_file.prompt_tokens > rows:
            raise SpecbenchError(f"tree ({self.tree_source}) uses {self.tree_file.prompt_tokens} prompt tokens but "
                                 f"the artefact ({self.prompts.source}) has {rows}; use a tree built for {rows}")

    def _make_layouts(self, table, ept: int, device) -> dict:
        """state -> TreeLayout; state 0 is the prefill (and the step after a node that carried no prompt tokens)."""
        m = self.tree_file.prompt_tokens
        layouts = {k: TreeLayout(self.tree_file.tree(k, ept), table, device) for k in self.tree_file.states}
        layouts[0] = TreeLayout(Tree((), (m,), ept), table, device)
        return layouts

    def _forward(self, tokens: torch.Tensor, layout: TreeLayout, cache, prefix: int = 0) -> torch.Tensor:
        """One forward of [prefix tokens, root, candidates | prompt inputs] -> hidden states of the tree [q, H]."""
        model = self.target.model
        past = cache_length(cache)
        embeds = pt.embed(model, tokens, layout.rows)  # [1, prefix + q, H]
        mask = attention_mask(layout.visible, past, embeds.dtype, prefix)
        h = pt.hidden(model, embeds, mask, position_ids(layout.offsets, past, prefix), cache)
        return h[prefix:]

    def _prompt_logits(self, h: torch.Tensor, layout: TreeLayout, node: int,
                       all_logits: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [c, V] of the c prompt tokens of `node`, averaged over their ensemble copies (PPD §3.2); taken
        from all_logits [q, V] when the step already computed the head over every input."""
        slots = layout.tree.prompt_slots[node]
        if not slots:
            return h.new_zeros(0, self.target.vocab_size)
        idx = torch.tensor(slots, device=h.device)  # [c, E]
        if all_logits is not None:
            return all_logits[idx].mean(1)
        return self.target.model.get_output_embeddings()(h[idx]).float().mean(1)

    def _accept(self, tokens, parents, logits, sampling, generator):
        if self.typical:
            return tree_typical_accept(tokens, parents, logits, sampling, generator)
        return tree_speculative_accept(tokens, parents, logits, sampling, generator)

    @torch.inference_mode()
    def generate(self, input_ids, max_new_tokens, sampling, generator):
        model, stop_ids = self.target.model, self.target.tokenizer.stop_ids
        head = model.get_output_embeddings()
        gen = Generation()
        cache = new_cache(model)
        ids = input_ids[0]  # [T]
        # 0. prefill: the prompt, its last token carrying the root's m prompt tokens
        layout = self.layouts[0]
        h = self._forward(ids, layout, cache, prefix=len(ids) - 1)
        keep_positions(cache, len(ids) - 1, [0])
        root = next_token(head(h[0]).float(), sampling, generator)
        guesses = self._prompt_logits(h, layout, 0)  # [m, V]
        done = gen.emit([root], stop_ids, max_new_tokens)
        while not done:
            layout = self.layouts[guesses.shape[0]]
            tree = layout.tree
            # 1. draft: candidate tokens = top-k guesses of the accepted node's prompt tokens, by rank
            topk = guesses[: tree.depth].topk(max(layout.max_rank, 1), dim=-1).indices  # [D, K]
            tokens = torch.cat([torch.tensor([root], device=ids.device), tree.candidate_tokens(topk)])  # [N]
            # 2. verify: one forward over root, candidates and every node's prompt tokens
            past = cache_length(cache)
            h = self._forward(tokens, layout, cache)  # [q, H]
            all_logits = head(h).float() if layout.combined_head else None  # [q, V]
            logits = all_logits[: tree.nodes] if layout.combined_head else head(h[: tree.nodes]).float()  # [N, V]
            # 3. accept: the longest verified path, then the target's own next token
            path, root = self._accept(tokens, layout.parents, logits, sampling, generator)
            accepted = tokens[path[1:]].tolist()
            gen.count_draft(tree.depth, len(accepted))
            # 4. update cache: keep the root and the accepted path; next candidates from the last accepted node
            keep_positions(cache, past, path)
            guesses = self._prompt_logits(h, layout, path[-1], all_logits)  # [c, V]: c is the next state
            done = gen.emit(accepted + [root], stop_ids, max_new_tokens)
        return gen

    # batch > 1 (methods/batch_loop.py): the same four phases per sample, every sample's tree in one forward

    def decode_step(self, target, joining, active, max_new_tokens, sampling):
        """Newcomers' prefill (the prompt, its last token carrying the root's prompt tokens) and every active
        sample's tree (root, candidates, prompt inputs; its tree mask and positions) in one batched forward."""
        model, stop_ids = self.target.model, self.target.tokenizer.stop_ids
        head = model.get_output_embeddings()
        device = self.target.device
        prefill = self.layouts[0]
        joined = []
        for s in joining:  # 0. prefill, as batch 1's: the prompt, then the root's tree over the same cache
            ids = torch.tensor(s.history, device=device)  # [T]
            prefix = len(ids) - 1
            joined.append(Segment(s.slot, s.history, keep=prefill.visible.shape[0],
                                  positions=position_ids(prefill.offsets, 0, prefix)[0].tolist(),
                                  mask=visibility(prefill.visible, 0, prefix),
                                  embeds=pt.embed(model, ids, prefill.rows)[0]))
        steps = []
        for s in active:
            layout = self.layouts[s.scratch["guesses"].shape[0]]
            tree = layout.tree
            # 1. draft: candidate tokens = top-k guesses of the accepted node's prompt tokens, by rank
            topk = s.scratch["guesses"][: tree.depth].topk(max(layout.max_rank, 1), dim=-1).indices  # [D, K]
            tokens = torch.cat([torch.tensor([s.history[-1]], device=device), tree.candidate_tokens(topk)])  # [N]
            past = target.lengths[s.slot]
            s.scratch.update(layout=layout, tokens=tokens, past=past)
            steps.append(Segment(s.slot, tokens.tolist(), positions=position_ids(layout.offsets, past)[0].tolist(),
                                 mask=layout.visible, embeds=pt.embed(model, tokens, layout.rows)[0]))
        # 2. verify: one batched forward over every newcomer's prefill and every active sample's tree
        first, hidden = target.forward(joined, steps, hidden=True)
        finished = []
        for s, h in zip(joining, first):
            target.keep_offsets(s.slot, len(s.history) - 1, [0])  # the root's prompt inputs leave the cache
            root = next_token(head(h[0]).float(), sampling, s.generator)
            s.scratch["guesses"] = self._prompt_logits(h, prefill, 0)  # [m, V]
            s.history.append(root)
            if s.gen.emit([root], stop_ids, max_new_tokens):
                finished.append(s)
        for s, h in zip(active, hidden):
            layout, tokens, tree = s.scratch["layout"], s.scratch["tokens"], s.scratch["layout"].tree
            all_logits = head(h).float() if layout.combined_head else None  # [q, V]
            logits = all_logits[: tree.nodes] if layout.combined_head else head(h[: tree.nodes]).float()  # [N, V]
            # 3. accept: the longest verified path, then the target's own next token
            path, root = self._accept(tokens, layout.parents, logits, sampling, s.generator)
            accepted = tokens[path[1:]].tolist()
            s.gen.count_draft(tree.depth, len(accepted))
            # 4. update cache: keep the root and the accepted path; next candidates from the last accepted node
            target.keep_offsets(s.slot, s.scratch["past"], path)
            s.scratch["guesses"] = self._prompt_logits(h, layout, path[-1], all_logits)  # [c, V]
            s.history += accepted + [root]
            if s.gen.emit(accepted + [root], stop_ids, max_new_tokens):
                finished.append(s)
        return finished


@register
class ParallelPromptDecodingTypical(ParallelPromptDecoding):
    name = "ppd-typical"
    lossless = False
    typical = True
    summary = "ppd with typical acceptance at T > 0 (Medusa's rule, posterior threshold 0.09, alpha 0.3; lossy)"

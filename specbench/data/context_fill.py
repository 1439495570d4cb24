"""Prompts lengthened to a context length, for `specbench map --context C`: each prompt keeps its own question last
and is preceded by the set's following records as earlier material, up to about C tokens in all, so a method's
acceptance and step cost are measured with a KV cache of that length. Lengths are in characters (CHARS_PER_TOKEN
per token, about what English text comes to in the default model's tokenizer); the run records the real prompt
lengths in tokens (records.csv's prompt_tokens, map.csv's kv). Deterministic: file order only."""

from __future__ import annotations

from ..errors import SpecbenchError
from .specs import Prompt

CHARS_PER_TOKEN = 4
HEADER = "Earlier material, for reference:\n\n"
QUESTION = "\n\nNow the task:\n\n"


def lengthened(prompts: list[Prompt], pool: list[Prompt], context_tokens: int) -> list[dict]:
    """One user-file record per prompt ({id, prompt, category}): the first turn of each prompt after as many of
    `pool`'s first turns (the records after it, wrapping around; never itself) as fit in `context_tokens`."""
    if context_tokens < 16:
        raise SpecbenchError(f"--context {context_tokens}: a context length must be at least 16 tokens")
    if len(pool) < 2:
        raise SpecbenchError("--context: the dataset needs at least two prompts to lengthen one with the others")
    budget = context_tokens * CHARS_PER_TOKEN
    out = []
    for index, prompt in enumerate(prompts):
        text = prompt.turns[0]
        parts, used = [], len(HEADER) + len(QUESTION) + len(text)
        for step in range(1, len(pool)):
            other = pool[(index + step) % len(pool)]
            if other.id == prompt.id:
                continue
            piece = other.turns[0].strip()
            if used + len(piece) + 2 > budget:
                piece = piece[: max(0, budget - used - 2)]
            if not piece:
                break
            parts.append(piece)
            used += len(piece) + 2
        body = (HEADER + "\n\n".join(parts) + QUESTION if parts else "") + text
        out.append({"id": prompt.id, "prompt": body, **({"category": prompt.category} if prompt.category else {})})
    return out

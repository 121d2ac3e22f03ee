"""Prompt-lookup drafts for speculative decoding (kv_decode.py), as transformers'
`prompt_lookup_num_tokens`: an agent's reply often copies text from its context (file contents, paths,
commands), so the tokens that followed the last occurrence of the sequence's final n-gram are a cheap
guess at what comes next. The guess is only a draft: the model verifies all of it in one forward pass and
decode keeps the longest prefix it would have produced itself, so the output does not depend on it (to the
rounding of the verify pass: exact in float32, not in bfloat16, where smollm2 leaves it off by default)."""

from __future__ import annotations

DEFAULT_DRAFT_TOKENS = 8  # the most tokens drafted per step (one forward pass reads draft + 1 positions)
NGRAM_SIZES = (3, 2)  # the final n-grams looked up, longest first; a single token is too weak a match


def draft(context: list[int], *, tokens: int = DEFAULT_DRAFT_TOKENS, window: int = 4096) -> list[int]:
    """Up to `tokens` ids that followed the most recent earlier occurrence of `context`'s final n-gram
    (within the last `window` ids); empty when no n-gram recurs."""
    if tokens < 1:
        return []
    end = len(context)
    low = max(0, end - window)
    for size in NGRAM_SIZES:
        if end <= size:
            continue
        pattern = context[end - size:]
        last = pattern[-1]
        # scan backwards for the most recent occurrence ending before the final position
        position = end - 2
        while position >= low + size - 1:
            if context[position] == last and context[position - size + 1:position + 1] == pattern:
                follow = context[position + 1:position + 1 + tokens]
                if follow:
                    return follow
            position -= 1
    return []

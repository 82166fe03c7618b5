"""Q5's evidence from a pilot: how often n-gram prompt lookup would have been right on this job.

A verified run emits exactly the tokens the model samples without speculation, so replaying the
engine's lookup (``NgramIndex``, k drafts per step) over the pilot's own prompts and outputs gives the
acceptance, and the tokens per step, that ``speculative: {method: ngram}`` would measure on these rows.
"""

from __future__ import annotations

from collections.abc import Sequence

REPLAY_K = 4  # drafts per step, vLLM's usual num_speculative_tokens


def replay_ngram(prompt: Sequence[int], output: Sequence[int], k: int = REPLAY_K) -> tuple[int, int, int]:
    """(drafts proposed, drafts accepted, decode steps) for one request under n-gram speculation."""
    from prefixflow.pipeline.engine_access import NgramIndex  # the engine's own lookup (lazy: torch-free)

    if not output:
        return 0, 0, 0
    index = NgramIndex(2, 5)
    tokens = [*prompt, output[0]]  # the first token comes from the prefill step
    proposed = accepted = 0
    steps, i = 1, 1
    while i < len(output):
        draft = index.propose(tokens, min(k, len(output) - i - 1))
        m = 0
        while m < len(draft) and draft[m] == output[i + m]:
            m += 1
        proposed += len(draft)
        accepted += m
        steps += 1
        tokens.extend(output[i : i + m + 1])
        i += m + 1
    return proposed, accepted, steps

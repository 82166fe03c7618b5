"""What n-gram speculation (k drafts per step, grammar-forced drafts on) would have done on finished
requests, replayed from their prompts and output tokens: the advisor's Q5 evidence from a pilot.

Verification is exact (verify.py): a draft is accepted exactly when it equals the token the target
produces at that position without speculation, greedy or seeded. So replaying the engine's own
proposers (``NgramIndex``, ``ForcedDrafts`` with a fresh grammar matcher per request) over the real
output tokens gives the drafts and acceptance a run with ``speculative: {method: ngram,
num_speculative_tokens: k}`` would measure on these rows. The output must be the model's token ids, not
a re-encoding of its text: the model often splits forced literals differently from the tokenizer, and a
re-encoding would make every forced draft look accepted. Forced splits are learned across the requests
in the order they are added, as the engine learns them across a job's rows. With ``prefill_drafts``
(the engine's default) the step that samples the first token verifies drafts as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prefixflow.engine.speculative.forced import ForcedDrafts, Pending
from prefixflow.engine.speculative.ngram import NgramIndex

REPLAY_K = 4  # drafts per step, vLLM's usual num_speculative_tokens


@dataclass
class ReplayCounts:
    """Drafts proposed and accepted (all, and the grammar-forced share) and decode steps."""

    proposed: int = 0
    accepted: int = 0
    steps: int = 0
    forced_proposed: int = 0
    forced_accepted: int = 0


class SpeculationReplay:
    """Replays requests one at a time; ``llm`` (an ``LLM``) supplies the grammar and tokenizer for
    structured requests (without it they are replayed as plain lookups)."""

    def __init__(
        self,
        llm: Any = None,
        k: int = REPLAY_K,
        lookup_min: int = 2,
        lookup_max: int = 5,
        prefill_drafts: bool = True,
    ) -> None:
        self.k, self.lookup_min, self.lookup_max = k, lookup_min, lookup_max
        self.prefill_drafts = prefill_drafts  # the prefill step verifies drafts too (as the engine does)
        self.structured = llm.engine.structured if llm is not None else None
        self.forced = (
            ForcedDrafts(llm.engine.tokenizer, self.structured.token_bytes)
            if self.structured is not None
            else None
        )
        self.counts = ReplayCounts()

    def add(self, prompt: Sequence[int], output: Sequence[int], structured: Any = None) -> None:
        """One finished request: its prompt and output token ids, and its ``StructuredOutputs`` (or None)."""
        if not output:
            return
        c = self.counts
        matcher = None
        if structured is not None and self.structured is not None and self.forced is not None:
            matcher = self.structured.new_matcher(structured)
        index = NgramIndex(self.lookup_min, self.lookup_max)
        pending: list[Pending] = []
        tokens = list(prompt)
        i = 0
        if not self.prefill_drafts:  # the first token comes from the prefill step alone
            tokens.append(output[0])
            if matcher is not None and not matcher.accept_token(output[0]):
                matcher = None  # not this grammar's output (a stop token): replay the lookup alone
            c.steps += 1
            i = 1
        while i < len(output):
            limit = min(self.k, len(output) - i - 1)
            if matcher is not None and self.forced is not None:
                drafts, forced = self.forced.propose(matcher, tokens, index, limit, pending)
            else:
                drafts = index.propose(tokens, limit)
                forced = [False] * len(drafts)
            m = 0
            while m < len(drafts) and drafts[m] == output[i + m]:
                m += 1
            c.proposed += len(drafts)
            c.accepted += m
            c.forced_proposed += sum(forced)
            c.forced_accepted += sum(forced[:m])
            c.steps += 1
            taken = list(output[i : i + m + 1])
            if matcher is not None:
                for t in taken:
                    if not matcher.accept_token(t):
                        matcher = None  # e.g. the stop token after a complete value
                        break
            tokens.extend(taken)
            i += m + 1

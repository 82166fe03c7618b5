"""The sampler's ``TokenLogprob`` records as vLLM returns them: per position, a dict from token id to
``Logprob(logprob, rank, decoded_token)``, the sampled (or prompt) token first, then the top-k."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from prefixflow.engine.outputs import Logprob, PositionLogprobs, PromptLogprobs, SampleLogprobs, TokenLogprob


class LogprobView:
    def __init__(self, tokenizer: Any) -> None:
        self._text = lru_cache(maxsize=1 << 16)(self._decode)
        self._tokenizer = tokenizer

    def _decode(self, token_id: int) -> str:
        text: str = self._tokenizer.decode([token_id])
        return text

    def position(self, record: TokenLogprob) -> PositionLogprobs:
        entries = {record.token_id: Logprob(record.logprob, record.rank, self._text(record.token_id))}
        for rank, (token, value) in enumerate(record.top, start=1):
            if token not in entries:
                entries[token] = Logprob(value, rank, self._text(token))
        return entries

    def sample(self, records: Iterable[TokenLogprob]) -> SampleLogprobs:
        return [self.position(r) for r in records]

    def prompt(self, records: Mapping[int, TokenLogprob], num_prompt_tokens: int) -> PromptLogprobs:
        """``[None, {...}, ...]``: one entry per prompt token; the first has no context to score it."""
        out: PromptLogprobs = [None]
        out.extend(self.position(records[q]) for q in range(1, num_prompt_tokens))
        return out

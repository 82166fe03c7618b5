"""Decides when a request is done (EOS, stop ids, stop strings, max_tokens, context limit) and
produces its final text, truncated at a stop string."""

from __future__ import annotations

from typing import Any

from prefixflow.engine.outputs import FinishReason
from prefixflow.engine.request import Request
from prefixflow.engine.utf8_tail import trim_incomplete_utf8


class StopChecker:
    def __init__(self, tokenizer: Any, eos_ids: tuple[int, ...], max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = set(eos_ids)
        self.max_model_len = max_model_len

    def check(self, req: Request) -> tuple[FinishReason, str | int | None] | None:
        """Return ``(finish_reason, stop_reason)`` once the newest token ends the request."""
        params = req.params
        token = req.token_ids[-1]
        can_stop = req.num_output_tokens >= params.min_tokens
        if can_stop and token in params.stop_token_ids:
            return "stop", token
        if can_stop and not params.ignore_eos and token in self.eos_ids:
            return "stop", None
        if can_stop and params.stop_strings:
            text = self._decode(req)
            for stop in params.stop_strings:
                if stop in text:
                    return "stop", stop
        if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.max_model_len:
            return "length", None
        return None

    def final_text(self, req: Request, stop_reason: str | int | None) -> str:
        """The output text, cut at a stop string; a character left incomplete by the last token
        (max_tokens hit inside an emoji) is dropped rather than shown as U+FFFD."""
        text = self._decode(req)
        if isinstance(stop_reason, str):
            cut = text.find(stop_reason)
            if cut >= 0:
                keep = cut + (len(stop_reason) if req.params.include_stop_str_in_output else 0)
                return text[:keep]
        return trim_incomplete_utf8(text, self.tokenizer, req.output_token_ids, req.params.skip_special_tokens)

    def _decode(self, req: Request) -> str:
        text: str = self.tokenizer.decode(req.output_token_ids, skip_special_tokens=req.params.skip_special_tokens)
        return text

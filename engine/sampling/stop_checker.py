"""Decides when a request is done (EOS, stop ids, stop strings, max_tokens, context limit) and
produces its final text, as vLLM does:

- ``min_tokens`` holds back every stop: stop ids and EOS are masked in the sampler, and a stop string
  counts only when it ends in the text of output token ``min_tokens`` or later (vLLM's detokenizer
  searches only the text that tokens past ``min_tokens`` added), so an early occurrence never cuts the
  text of a longer output;
- each step searches only the text the newest token added (plus the ``len(stop) - 1`` characters
  before it, so a stop spread over tokens is found), which also keeps the check linear;
- the text is cut at the occurrence that ended the request (not at an earlier one), and a stop token
  (EOS, ``stop_token_ids``, the grammar's end) is not detokenized unless
  ``include_stop_str_in_output``; ``token_ids`` always hold every generated token, the stop token or
  the token that completed the stop string included.
"""

from __future__ import annotations

from typing import Any

from prefixflow.engine.core.request import Request
from prefixflow.engine.outputs import FinishReason
from prefixflow.engine.sampling.utf8_tail import REPLACEMENT, trim_incomplete_utf8


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
            stop = self._find_stop_string(req)
            if stop is not None:
                return "stop", stop
        if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.max_model_len:
            return "length", None
        return None

    def _find_stop_string(self, req: Request) -> str | None:
        """The stop string that ends in the newest token's text (the earliest one when several do);
        records where it starts in ``req.stop_at``."""
        out = req.output_token_ids
        if req.stop_scan_from is None:  # the first token that may stop: the text before it is old
            req.stop_scan_from = _stable_length(self._decode(out[:-1], req))
        text = self._decode(out, req)
        best: tuple[int, str] | None = None
        for stop in req.params.stop_strings:
            at = text.find(stop, max(0, req.stop_scan_from - len(stop) + 1))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        req.stop_scan_from = _stable_length(text)
        if best is None:
            return None
        req.stop_at = best[0]
        return best[1]

    def final_text(self, req: Request, stop_reason: str | int | None) -> str:
        """The output text: cut at the stop string that ended it, without the stop token's text, and
        without a character left incomplete by the last token (max_tokens hit inside an emoji) rather
        than a U+FFFD; ``include_stop_str_in_output`` keeps the stop string or token."""
        out = req.output_token_ids
        include = req.params.include_stop_str_in_output
        if isinstance(stop_reason, str) and req.stop_at is not None:
            text = self._decode(out, req)
            return text[: req.stop_at + (len(stop_reason) if include else 0)]
        if req.finish_reason == "stop" and not include and req.generates:
            out = out[:-1]  # EOS, a stop_token_id or the grammar's end token: not part of the text
        text = self._decode(out, req)
        return trim_incomplete_utf8(text, self.tokenizer, out, req.params.skip_special_tokens)

    def _decode(self, token_ids: list[int], req: Request) -> str:
        if not token_ids:
            return ""
        text: str = self.tokenizer.decode(token_ids, skip_special_tokens=req.params.skip_special_tokens)
        return text


def _stable_length(text: str) -> int:
    """Characters that later tokens cannot change: a trailing U+FFFD may still become a character."""
    return len(text.rstrip(REPLACEMENT))

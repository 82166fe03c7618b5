"""Grammar-forced drafts (jump-forward) for structured-output requests, interleaved with the lookup.

Under a JSON schema long stretches of the output are forced: the keys, quotes and separators after a
value (``", "product": "``), a closing bracket. The grammar matcher names the forced continuation
(``find_jump_forward_string``); its canonical tokenization (the tokenizer's own encoding, which is
what the model usually picks: xgrammar's greedy longest-token split is accepted less often on SmolLM2)
becomes drafts. Where nothing is forced (a value), the n-gram lookup continues over the real tokens
plus the drafts so far, and its drafts are cut at the first token the grammar refuses (the target could
never accept it); after them the forced continuation is asked for again, and so on up to k drafts.

Verification is the ordinary exact one (verify.py): a forced draft is accepted only when the target,
sampling that position under the grammar mask, picks it; outputs are unchanged. Unlike SGLang's
jump-forward, which retokenizes and so can change the output, nothing here is emitted unverified.
The matcher is advanced over the drafts and rolled back before returning: it keeps exactly the
request's output tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from prefixflow.engine.speculative.ngram import NgramIndex

MAX_CACHED = 4096  # forced strings repeat across the rows of one schema: encode each once


class ForcedDrafts:
    """Proposes forced-then-looked-up drafts; ``forced`` marks which drafts the grammar forced."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._encoded: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    def encode(self, text: str) -> tuple[int, ...]:
        ids = self._encoded.get(text)
        if ids is None:
            ids = tuple(int(t) for t in self.tokenizer.encode(text, add_special_tokens=False))
            self._encoded[text] = ids
            if len(self._encoded) > MAX_CACHED:
                self._encoded.popitem(last=False)
        else:
            self._encoded.move_to_end(text)
        return ids

    def propose(
        self, matcher: Any, tokens: list[int], index: NgramIndex | None, k: int
    ) -> tuple[list[int], list[bool]]:
        """Up to ``k`` drafts after ``tokens`` (the request's real tokens; ``matcher`` has consumed its
        output) and, per draft, whether the grammar forced it."""
        drafts: list[int] = []
        forced: list[bool] = []
        advanced = 0
        if index is not None:
            index.extend(tokens)
        try:
            while len(drafts) < k and not matcher.is_terminated():
                text = matcher.find_jump_forward_string()
                made = 0
                for token in self.encode(text) if text else ():
                    if len(drafts) >= k or not matcher.accept_token(token):
                        break
                    advanced += 1
                    made += 1
                    drafts.append(token)
                    forced.append(True)
                if len(drafts) >= k or index is None or matcher.is_terminated():
                    break
                looked = index.lookup(tokens + drafts, k - len(drafts))
                for token in looked:
                    if not matcher.accept_token(token):
                        break  # the grammar refuses it: the target can never accept it or anything after
                    advanced += 1
                    made += 1
                    drafts.append(token)
                    forced.append(False)
                    if matcher.is_terminated():
                        break
                if not made:
                    break
        finally:
            if advanced:
                matcher.rollback(advanced)
        return drafts, forced

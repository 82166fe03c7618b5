"""Grammar-forced drafts (jump-forward) for structured-output requests, interleaved with the lookup.

Under a JSON schema long stretches of the output are forced: the keys, quotes and separators after a
value (``", "product": "``), a closing bracket. The grammar matcher names the forced continuation
(``find_jump_forward_string``) and its tokens become drafts. Which tokens: the model does not always
spell a literal the way its tokenizer encodes it (SmolLM2 under the mask emits ``"`` + ``:`` for the
encoding's ``":``, ``{`` + ``"`` for ``{"``), and a draft is rejected at the first token that differs.
So each forced string seen at a request's real position is remembered (``Pending``), and once the
request's real tokens have passed it, the tokens the target produced for it are counted as one of
that string's splits (``learn``): the longest run of output tokens whose bytes spell a prefix of the
string (empty when the model's first token already runs past it, e.g. merges a quote with the value
after it). Later rows of the same schema propose the split the target chose most often (the most
recent on a tie; counts are halved now and then, so a change of habit wins within a few rows). The
choice is not a pure function of the string: on the extraction benchmark SmolLM2 spelled ``": `` as
``"`` + ``:`` in two rows and as ``":`` in a third with the same token before it, so the majority is
the best guess. A string never seen yet uses the tokenizer's encoding.

Where nothing is forced (a value), the n-gram lookup continues over the real tokens plus the drafts
so far, and its drafts are cut at the first token the grammar refuses (the target could never accept
it); after them the forced continuation is asked for again, and so on up to k drafts.

Verification is the ordinary exact one (verify.py): a forced draft is accepted only when the target,
sampling that position under the grammar mask, picks it; outputs are unchanged whatever is proposed.
Unlike SGLang's jump-forward, which retokenizes and so can change the output, nothing here is emitted
unverified. The matcher is advanced over the drafts and rolled back before returning: it keeps exactly
the request's output tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prefixflow.engine.speculative.ngram import NgramIndex

MAX_CACHED = 4096  # forced strings repeat across the rows of one schema: encode (and learn) each once
MAX_PENDING = 8  # forced strings per request waiting for the target's tokens (each resolves in a step or two)
HALVE_AT = 16  # observed splits of one string before their counts are halved (recent rows weigh more)


@dataclass(frozen=True)
class Pending:
    """A forced string met at token index ``start`` of a request, its split not yet seen."""

    start: int
    text: bytes


class ForcedDrafts:
    """Proposes forced-then-looked-up drafts; ``forced`` marks which drafts the grammar forced.

    ``token_bytes`` gives every token id's bytes (the structured-output manager's table); without it
    nothing is learned and forced strings keep the tokenizer's encoding."""

    def __init__(self, tokenizer: Any, token_bytes: Callable[[], Sequence[bytes]] | None = None) -> None:
        self.tokenizer = tokenizer
        self.token_bytes = token_bytes
        self._encoded: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        # per forced string: how often the target spelled it each way (insertion order: most recent last)
        self._learned: OrderedDict[bytes, dict[tuple[int, ...], int]] = OrderedDict()
        self.learned_splits = 0  # splits observed from the target (tests, stats)

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

    def split(self, text: str) -> tuple[int, ...]:
        """The tokens to draft for a forced string: the target's own split when one was seen."""
        seen = self._learned.get(text.encode("utf-8"))
        if not seen:
            return self.encode(text)
        best = max(seen.values())
        return next(ids for ids in reversed(seen) if seen[ids] == best)

    def _observe(self, text: bytes, ids: tuple[int, ...]) -> None:
        seen = self._learned.setdefault(text, {})
        self._learned.move_to_end(text)
        seen[ids] = seen.pop(ids, 0) + 1  # re-inserted: the most recent split is last
        self.learned_splits += 1
        if sum(seen.values()) > HALVE_AT:
            for key in list(seen):
                seen[key] //= 2
                if not seen[key]:
                    del seen[key]
        if len(self._learned) > MAX_CACHED:
            self._learned.popitem(last=False)

    def learn(self, pending: list[Pending], tokens: list[int]) -> None:
        """Resolve the pending strings the request's real ``tokens`` have passed; keep the others."""
        if not pending or self.token_bytes is None:
            pending.clear()
            return
        vocab = self.token_bytes()
        keep = []
        for entry in pending:
            spelled = b""
            ids: list[int] = []
            done = False
            for token in tokens[entry.start :]:
                more = spelled + (vocab[token] if 0 <= token < len(vocab) else b"")
                if more == spelled or not entry.text.startswith(more):
                    done = True  # this token runs past the string (or spells nothing): the split ends
                    break
                spelled = more
                ids.append(token)
                if spelled == entry.text:
                    done = True
                    break
            if not done:
                keep.append(entry)  # the target has not got past it yet
                continue
            self._observe(entry.text, tuple(ids))
        pending[:] = keep[-MAX_PENDING:]

    def propose(
        self,
        matcher: Any,
        tokens: list[int],
        index: NgramIndex | None,
        k: int,
        pending: list[Pending] | None = None,
    ) -> tuple[list[int], list[bool]]:
        """Up to ``k`` drafts after ``tokens`` (the request's real tokens; ``matcher`` has consumed its
        output) and, per draft, whether the grammar forced it. ``pending``: the request's strings
        awaiting their split (resolved against ``tokens`` first; the one forced here is added)."""
        if pending is not None:
            self.learn(pending, tokens)
        drafts: list[int] = []
        forced: list[bool] = []
        advanced = 0
        if index is not None:
            index.extend(tokens)
        try:
            while len(drafts) < k and not matcher.is_terminated():
                text = matcher.find_jump_forward_string()
                if text and not drafts and pending is not None and self.token_bytes is not None:
                    pending.append(Pending(len(tokens), text.encode("utf-8")))
                made = 0
                for token in self.split(text) if text else ():
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

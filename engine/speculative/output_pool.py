"""Cross-request lookup: n-gram statistics over the outputs of the engine's other requests.

An offline job runs one prompt template over many rows, and its outputs share far more than any one
prompt does: the opening ("The review is"), the phrasing of a verdict, the skeleton of a summary.
Prompt lookup (ngram.py) sees only the request's own tokens, so it proposes nothing on those
stretches. This pool (the idea of SuffixDecoding, Oliaro et al. 2024, kept as hash maps of counts
rather than a suffix tree) counts, for every n-gram of every recent output, which token followed it;
a draft continues greedily with the most frequent follower while that follower's share of the counts
is at least ``min_probability``. Each output is indexed with the last prompt tokens before it, so the
template's assistant header predicts how outputs begin. Outputs are indexed as they are produced,
so requests of one batch also learn from each other. The pool keeps the last ``max_requests``
requests' outputs; an older one's counts are taken out again, which bounds its memory.

Drafts from the pool are verified like any other (exact), so they change no output, only how many
positions a step verifies.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class _Indexed:
    """One request's tokens in the pool: a context of prompt tokens, then its output so far."""

    tokens: list[int]
    first: int  # tokens[first:] is output: only those are indexed as followers


@dataclass
class OutputPool:
    min_n: int
    max_n: int
    max_requests: int
    min_probability: float
    # n-gram -> follower token -> count, over the indexed outputs
    counts: dict[tuple[int, ...], dict[int, int]] = field(default_factory=dict)
    requests: OrderedDict[int, _Indexed] = field(default_factory=OrderedDict)

    def extend(self, key: int, tokens: Sequence[int], prompt_len: int, end: int) -> None:
        """Index request ``key``'s output ``tokens[prompt_len:end]`` as far as not indexed yet (a new
        request starts with the last ``max_n`` prompt tokens as its context)."""
        entry = self.requests.get(key)
        if entry is None:
            context = list(tokens[max(0, prompt_len - self.max_n) : prompt_len])
            entry = self.requests[key] = _Indexed(context, len(context))
            while len(self.requests) > self.max_requests:
                _, old = self.requests.popitem(last=False)
                self._count(old.tokens, old.first, len(old.tokens), -1)
        start = len(entry.tokens)
        new = tokens[prompt_len + start - entry.first : end]
        if not new:
            return
        entry.tokens.extend(new)
        self._count(entry.tokens, start, len(entry.tokens), +1)

    def _count(self, tokens: list[int], begin: int, end: int, delta: int) -> None:
        """Add ``delta`` to the follower count of every n-gram ending right before positions
        ``begin..end-1`` (each such position's token follows the n tokens before it)."""
        for e in range(begin, end):
            follower = tokens[e]
            for n in range(self.min_n, min(self.max_n, e) + 1):
                gram = tuple(tokens[e - n : e])
                followers = self.counts.get(gram)
                if followers is None:
                    followers = self.counts[gram] = {}
                c = followers.get(follower, 0) + delta
                if c > 0:
                    followers[follower] = c
                else:
                    followers.pop(follower, None)
                    if not followers:
                        del self.counts[gram]

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens after ``tokens``: at each position the most frequent follower of the
        longest known suffix, while it holds ``min_probability`` of that suffix's followers."""
        context = list(tokens[max(0, len(tokens) - self.max_n) :])
        out: list[int] = []
        while len(out) < k:
            nxt = self._follower(context)
            if nxt is None:
                break
            out.append(nxt)
            context = context[1:] + [nxt] if len(context) >= self.max_n else context + [nxt]
        return out

    def _follower(self, context: list[int]) -> int | None:
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            followers = self.counts.get(tuple(context[len(context) - n :]))
            if followers:
                token, count = max(followers.items(), key=lambda kv: (kv[1], -kv[0]))
                return token if count >= self.min_probability * sum(followers.values()) else None
        return None

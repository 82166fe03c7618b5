"""N-gram prompt lookup, indexed: O(1) work per new token, not a scan of the context.

Each request keeps, per n-gram length n in [min, max], a hash map from the n tokens to the position
right after their most recent earlier occurrence. A new token adds one entry per n; a lookup tries
the current suffix from the longest n down and proposes the tokens that followed that occurrence.
The most recent occurrence wins (the text being copied is usually the one just quoted). Only
committed tokens are indexed, so a rejected draft never has to be taken out again.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NgramIndex:
    """The n-gram index of one request's tokens (prompt and output), built incrementally."""

    min_n: int
    max_n: int
    tables: list[dict[tuple[int, ...], int]] = field(default_factory=list)
    indexed: int = 0  # tokens[:indexed] have had every n-gram ending inside them indexed

    def __post_init__(self) -> None:
        self.tables = [{} for _ in range(self.max_n - self.min_n + 1)]

    def extend(self, tokens: list[int]) -> None:
        """Index the n-grams that end before the last token (they have a continuation token)."""
        end = len(tokens) - 1  # an n-gram tokens[e-n:e] is indexed with its continuation tokens[e]
        for i, table in enumerate(self.tables):
            n = self.min_n + i
            first = max(self.indexed, n) - n  # where the first n-gram not yet indexed starts
            if end - first < n:
                continue
            span = tokens[first:end]
            # the n-grams of ``span`` in order, built by zip in C: a prompt of hundreds of tokens is
            # indexed at once when a request first speculates; later entries overwrite earlier ones,
            # so each n-gram keeps its most recent occurrence
            grams = zip(*(span[j : len(span) - n + 1 + j] for j in range(n)))
            table.update(zip(grams, range(first + n, end + 1)))
        self.indexed = max(self.indexed, end + 1)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the longest earlier match of the current suffix."""
        if k <= 0:
            return []
        self.extend(tokens)
        return self.lookup(tokens, k)

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """``propose`` without indexing: ``tokens`` may end in drafts (the index covers only the real
        tokens before them), so a lookup can continue after grammar-forced drafts."""
        size = len(tokens)
        for i in range(len(self.tables) - 1, -1, -1):
            n = self.min_n + i
            if size <= n:
                continue
            start = self.tables[i].get(tuple(tokens[size - n :]))
            if start is not None:
                return tokens[start : min(start + k, size)]
        return []


def scan_propose(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The same answer by scanning the context (O(context)): the test oracle for ``NgramIndex``."""
    size = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if size <= n:
            continue
        suffix = tokens[size - n :]
        for e in range(size - 1, n - 1, -1):  # most recent occurrence that ends before the suffix ends
            if tokens[e - n : e] == suffix:
                return tokens[e : min(e + k, size)]
    return []

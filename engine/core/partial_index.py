"""Token-granular prefix sharing: which device block holds the longest run of a request's next tokens.

The prefix cache shares whole blocks by chained hash. A match that ends inside a block (the tail of
a shared instruction, the end of the previous chat turn) would otherwise recompute up to
``block_size - 1`` shared tokens per request. This index lists every device block whose KV is valid
for a known token run, by (parent block hash, first token): full computed blocks and the partial last
block of every request (kept while the request runs, and after it ends until the block is reused).
A request then copies that block (copy-on-write: one block copy on the device, see ``CopyPlan``) and
computes from the first token that differs.

Why copy-on-write of the last block rather than a token-granular radix tree: the paged KV layout,
block hashing, host tier and attention kernels all stay block-based; only one block per request is
ever copied, and a block copy (``block_bytes`` on the device) costs far less than computing its
tokens. A radix tree would share without the copy but needs token-granular block tables.
"""

from __future__ import annotations

from collections.abc import Sequence

Content = tuple[int | None, tuple[int, ...]]  # (parent block hash, the tokens whose KV the block holds)
SCAN = 8  # candidates compared per lookup, most recently registered first


class PartialIndex:
    def __init__(self) -> None:
        self._by_start: dict[tuple[int | None, int], dict[int, None]] = {}
        self.content: dict[int, Content] = {}

    def set(self, block_id: int, parent: int | None, tokens: Sequence[int]) -> None:
        """``block_id`` holds valid KV for ``tokens`` after the chain ``parent``."""
        old = self.content.get(block_id)
        if (
            old is not None
            and old[0] == parent
            and len(old[1]) <= len(tokens)
            and old[1] == tuple(tokens[: len(old[1])])
        ):
            if len(old[1]) == len(tokens):
                return
            self.content[block_id] = (parent, tuple(tokens))  # grew in place: same bucket
            return
        self.drop(block_id)
        if not tokens:
            return
        self.content[block_id] = (parent, tuple(tokens))
        self._by_start.setdefault((parent, tokens[0]), {})[block_id] = None

    def drop(self, block_id: int) -> None:
        """The block is handed out again: its old contents are about to be overwritten."""
        old = self.content.pop(block_id, None)
        if old is None:
            return
        key = (old[0], old[1][0])
        bucket = self._by_start[key]
        del bucket[block_id]
        if not bucket:
            del self._by_start[key]

    def best(self, parent: int | None, tokens: Sequence[int], limit: int) -> tuple[int, int] | None:
        """(block id, shared token count) of the candidate sharing most of ``tokens[:limit]``."""
        if limit <= 0 or not tokens:
            return None
        bucket = self._by_start.get((parent, tokens[0]))
        if not bucket:
            return None
        want = tokens[:limit]
        best: tuple[int, int] | None = None
        for scanned, block_id in enumerate(reversed(bucket)):
            if scanned >= SCAN:
                break
            have = self.content[block_id][1]
            k = _common(have, want)
            if best is None or k > best[1]:
                best = (block_id, k)
        return best


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n

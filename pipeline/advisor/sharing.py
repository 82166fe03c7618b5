"""How much of the job's prompt text is shared, measured on the token ids the engine would get.

In lexicographic order (the engine's prefix ordering) a prompt's longest common prefix with any
earlier prompt is the one with its predecessor, so one sort gives everything:
- distinct trie tokens: nodes of the prompts' token trie, the least any engine must compute;
- block minimum: the least a block-granular prefix cache computes (full blocks only, never a prompt's
  last token; unlimited memory), hence the best prefix hit rate this block size allows;
- shared heads: the trie's branching points, with how many rows pass through them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class SharedHead:
    tokens: int  # length of the shared head
    rows: int  # sampled rows whose prompts start with it
    prompts: int
    preview: str  # the head's text, shortened


@dataclass
class Sharing:
    requests: int
    prompt_tokens: int
    distinct_tokens: int
    block_min_tokens: int
    block_size: int
    cached_tokens: list[int]  # per request (in input order): prompt tokens a block cache serves in trie order
    cache_blocks_needed: int  # blocks the deepest shared head occupies: the pool must keep at least these
    heads: list[SharedHead] = field(default_factory=list)

    @property
    def best_hit_rate(self) -> float:
        """Share of prompt tokens the prefix cache can serve at this block size, in prefix order."""
        return 1.0 - self.block_min_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def distinct_share(self) -> float:
        return self.distinct_tokens / self.prompt_tokens if self.prompt_tokens else 1.0


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists (numpy for long prompts)."""
    n = min(len(a), len(b))
    if n < 64:
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        return i
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def _lcp_arrays(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def distinct_prefix_tokens(prompts: Sequence[Sequence[int]]) -> int:
    """Number of nodes in the token trie of ``prompts`` (exact)."""
    ordered = sorted(tuple(p) for p in prompts)
    return sum(len(p) - lcp(q, p) for q, p in zip([()] + ordered[:-1], ordered))


def block_cache_min_tokens(prompts: Sequence[Sequence[int]], block_size: int) -> int:
    """Least prompt tokens a block-level prefix cache computes with unlimited memory and ideal order.

    Each prompt (in trie order) reuses the full blocks of its longest common prefix with an earlier
    prompt, never covering its own last token; identical prompts therefore recompute one block."""
    ordered = sorted(tuple(p) for p in prompts)
    total = 0
    for q, p in zip([()] + ordered[:-1], ordered):
        total += len(p) - (min(lcp(q, p), len(p) - 1) // block_size) * block_size
    return total


def analyze(
    prompts: Sequence[Sequence[int]],
    rows: Sequence[int],
    block_size: int,
    decode: Callable[[list[int]], str] | None = None,
    top: int = 5,
    suffixes: Sequence[Sequence[int]] = (),
) -> Sharing:
    """Sharing of the job's requests: one per prompt (``rows[i]``: the sampled row prompt i serves), or with
    ``suffixes`` (label scoring) one per prompt and suffix, ``prompt + suffix``, never built as lists.

    A prompt's suffixed requests run next to each other in prefix order: the first shares with its
    predecessor what the bare prompts share, the others the whole prompt plus their common prefix with
    the previous suffix. ``cached_tokens`` lists requests prompt by prompt, suffixes in the given order."""
    arrays = [np.asarray(p, dtype=">u4") for p in prompts]
    keys = [a.tobytes() for a in arrays]  # big-endian bytes sort like the token lists, at memcmp speed
    order = sorted(range(len(prompts)), key=keys.__getitem__)
    adj = [0] + [_lcp_arrays(arrays[a], arrays[b]) for a, b in zip(order, order[1:])]  # with the predecessor
    ends = [list(x) for x in suffixes] or [[]]
    s_order = sorted(range(len(ends)), key=lambda j: ends[j])
    s_adj = [0] + [lcp(ends[a], ends[b]) for a, b in zip(s_order, s_order[1:])]
    k_ends = len(ends)
    cached = [0] * (len(prompts) * k_ends)
    total = distinct = block_min = deepest = 0
    for k, i in enumerate(order):
        size = len(prompts[i])
        nxt = adj[k + 1] if k + 1 < len(order) else 0
        for rank, j in enumerate(s_order):
            n = size + len(ends[j])
            common = min(adj[k], size) if rank == 0 else size + s_adj[rank]
            reuse = (min(common, n - 1) // block_size) * block_size if n else 0
            cached[i * k_ends + j] = reuse
            total += n
            distinct += n - common
            block_min += n - reuse
            later = size + s_adj[rank + 1] if rank + 1 < k_ends else min(nxt, size)
            deepest = max(deepest, reuse // block_size, min(later, n - 1) // block_size)
    heads = _heads([prompts[i] for i in order], [rows[i] for i in order], adj, block_size, decode, top)
    return Sharing(len(cached), total, distinct, block_min, block_size, cached, deepest, heads)


def _heads(
    ordered: list[Sequence[int]],
    rows: list[int],
    adj: list[int],
    block_size: int,
    decode: Callable[[list[int]], str] | None,
    top: int,
) -> list[SharedHead]:
    """Branching points of the trie (LCP intervals) that add at least one full block over their parent,
    ranked by the tokens they save (head length x (rows - 1))."""
    found: list[tuple[int, int, int, int]] = []  # (depth, left, right, parent depth)
    stack: list[tuple[int, int]] = [(0, 0)]
    for i in range(1, len(ordered) + 1):
        cur = adj[i] if i < len(ordered) else -1
        left = i - 1
        while stack and stack[-1][0] > cur:
            depth, left = stack.pop()
            parent = max(cur, stack[-1][0] if stack else 0)
            if depth // block_size > parent // block_size:
                found.append((depth, left, i - 1, parent))
        if not stack or stack[-1][0] < cur:
            stack.append((max(cur, 0), left))
    # rank by tokens saved per prompt, then count the distinct rows of the best few exactly
    found.sort(key=lambda f: f[0] * (f[2] - f[1]), reverse=True)
    scored = []
    for depth, left, right, _ in found[: 8 * top]:
        n_rows = len(set(rows[left : right + 1]))
        if n_rows >= 2:
            scored.append((depth * (n_rows - 1), depth, n_rows, right - left + 1, left))
    scored.sort(reverse=True)
    return [
        SharedHead(depth, n_rows, n_req, _preview(decode, list(ordered[left][:depth])))
        for _, depth, n_rows, n_req, left in scored[:top]
    ]


def _preview(decode: Callable[[list[int]], str] | None, tokens: list[int], width: int = 48) -> str:
    if decode is None:
        return ""
    text = decode(tokens).replace("\n", "\\n")
    return text if len(text) <= 2 * width + 3 else f"{text[:width]}...{text[-width:]}"

"""Sampling a step that verifies drafts: every position of a run is sampled by the ordinary sampler.

Verification is exact-match rejection sampling with shared noise. Row j of a run holds the target's
logits after the drafts d_1..d_j and is sampled exactly as the plain engine would sample that
position (same penalties, masks and (seed, position) noise). Draft d_{j+1} is accepted when it equals
that sample; the first mismatch is replaced by the target's own sample, and a fully accepted run adds
the sample of its last row. Every emitted token is therefore the token speculation-off would have
produced: greedy is identical, seeded sampling is identical, and the output distribution is the
target's. For a deterministic proposal (n-gram, a greedy draft) a draft is accepted with probability
p_target(draft), what Leviathan et al.'s rule min(1, p/q) gives with q one-hot; a sampling draft
model draws with the same (seed, position) noise, which couples its choice to the target's.
"""

from __future__ import annotations

from typing import Any

import torch

from prefixflow.engine.core.request import Request
from prefixflow.engine.core.step_types import ModelOutput, TokenMasks
from prefixflow.engine.outputs import TokenLogprob
from prefixflow.engine.sampling.sampler import LogprobsMode, sample
from prefixflow.engine.structured.bitmask import allocate_bitmask


def owners(views: list[Request]) -> list[tuple[int, int]]:
    """(first row, row count) of each request among the sampler rows (a request's rows are adjacent)."""
    spans: list[tuple[int, int]] = []
    for i, view in enumerate(views):
        if spans and views[spans[-1][0]].key == view.key:
            spans[-1] = (spans[-1][0], spans[-1][1] + 1)
        else:
            spans.append((i, 1))
    return spans


def sample_verified(
    logits: torch.Tensor,
    views: list[Request],
    sampled_requests: list[Request],
    eos_ids: tuple[int, ...],
    masks: TokenMasks | None,
    vocab_size: int,
    out: ModelOutput,
    logprobs_mode: LogprobsMode = "raw",
) -> None:
    """Sample every row; plain requests go to ``out.sampled``, verified runs to ``out.verified``.
    ``sampled_requests`` are the real requests, one per run, in row order (the fill was planned on them)."""
    spans = owners(views)
    bitmask = None
    if masks is not None:  # the step's planned fill is per request: taken (and waited for) either way
        per_request = masks.take_bitmask(sampled_requests)
        if per_request is not None:
            bitmask = _expand(per_request, spans, views, vocab_size)
    tokens: list[int]
    logprobs: list[TokenLogprob | None]
    try:
        tokens, logprobs = sample(logits, views, eos_ids, bitmask, logprobs_mode)
    except Exception:
        tokens, logprobs = [], []
        for first, count in spans:  # one request at a time: a failure stays that request's
            rows = slice(first, first + count)
            try:
                row_mask = None if bitmask is None else bitmask[rows]
                t, lp = sample(logits[rows], views[rows], eos_ids, row_mask, logprobs_mode)
            except Exception as exc:
                out.errors[views[first].key] = f"sampling failed: {exc!r}"
                t, lp = [-1] * count, [None] * count
            tokens += t
            logprobs += lp
    for first, count in spans:
        key = views[first].key
        if key in out.errors:
            continue
        if count == 1:
            out.sampled[key] = tokens[first]
            one = logprobs[first]
            if one is not None:
                out.logprobs[key] = one
        else:
            out.verified[key] = tokens[first : first + count]
            lps = [x for x in logprobs[first : first + count] if x is not None]
            if lps:
                out.verified_logprobs[key] = lps


def _expand(
    per_request: torch.Tensor, spans: list[tuple[int, int]], views: list[Request], vocab: int
) -> torch.Tensor:
    """One bitmask row per sampled position: a run's row j is the grammar's mask after drafts d_1..d_j
    (the matcher advances over the drafts, fills, then rolls back; it keeps only accepted tokens)."""
    rows = len(views)
    if rows == len(spans):
        return per_request
    mask = allocate_bitmask(rows, vocab)
    for s, (first, count) in enumerate(spans):
        mask[first] = per_request[s]
        matcher: Any = views[first].grammar
        if count == 1 or matcher is None:
            continue
        last = views[first + count - 1]
        drafts = last.token_ids[len(views[first].token_ids) :]
        advanced = 0
        for j, token in enumerate(drafts, start=1):
            if not matcher.accept_token(token):
                break  # the target cannot emit this draft, so no later row is ever used
            advanced += 1
            matcher.fill_next_token_bitmask(mask, first + j)
        if advanced:
            matcher.rollback(advanced)
    return mask

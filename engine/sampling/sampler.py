"""Token selection: greedy, temperature, top-k, top-p, min-p, with noise that depends only on
(request seed, token position), so a seeded request draws the same tokens alone or in any batch.

``sample_batch`` is what the model runner calls: it samples the whole batch at once and, should that
fail, each row alone, so a request whose values break sampling becomes that request's error only.
Each request's ``logit_bias`` is added first (one scatter-add for the batch), then the masks: the
structured-output bitmask (one batched in-place op, ``apply_bitmask_``), then the per-request bans of
``_apply_masks`` (no stop token before ``min_tokens``). A biased token the grammar rules out stays out.

Log-probs (``EngineConfig.logprobs_mode``, vLLM's): ``raw`` is the model's own distribution, taken
before the logit bias, bitmask, penalties, bans, temperature and filters; ``processed`` is the
distribution the token was drawn from (all of those applied; greedy rows: bias, bitmask, penalties and
bans, no temperature).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from prefixflow.engine.core.request import Request
from prefixflow.engine.outputs import TokenLogprob
from prefixflow.engine.structured.bitmask import apply_bitmask_

_MASK64 = (1 << 64) - 1


def position_seed(seed: int, position: int) -> int:
    """SplitMix64 of (seed, position): well-spread generator seeds without per-process state."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


@dataclass
class SampleResult:
    """Per request key: the chosen token, its log-prob record when asked for, or why it failed."""

    tokens: dict[int, int] = field(default_factory=dict)
    logprobs: dict[int, TokenLogprob] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)


LogprobsMode = Literal["raw", "processed"]


def sample_batch(
    logits: torch.Tensor,
    requests: list[Request],
    eos_ids: tuple[int, ...],
    bitmask: torch.Tensor | None = None,
    logprobs_mode: LogprobsMode = "raw",
) -> SampleResult:
    """Sample every row; if the batch fails, retry row by row and report the rows that still fail."""
    result = SampleResult()
    try:
        tokens, logprobs = sample(logits, requests, eos_ids, bitmask, logprobs_mode)
    except Exception:
        for row, req in enumerate(requests):
            try:
                row_mask = None if bitmask is None else bitmask[row : row + 1]
                (token,), (lp,) = sample(logits[row : row + 1], [req], eos_ids, row_mask, logprobs_mode)
            except Exception as exc:
                result.errors[req.key] = f"sampling failed: {exc!r}"
                continue
            result.tokens[req.key] = token
            if lp is not None:
                result.logprobs[req.key] = lp
        return result
    for req, token, lp in zip(requests, tokens, logprobs):
        result.tokens[req.key] = token
        if lp is not None:
            result.logprobs[req.key] = lp
    return result


@torch.inference_mode()
def sample(
    logits: torch.Tensor,
    requests: list[Request],
    eos_ids: tuple[int, ...],
    bitmask: torch.Tensor | None = None,
    logprobs_mode: LogprobsMode = "raw",
) -> tuple[list[int], list[TokenLogprob | None]]:
    """Return one token per row and, per row, a ``TokenLogprob`` (or None when not requested).

    ``bitmask`` (structured outputs) has one row per request; disallowed tokens get -inf in one in-place
    op before anything else, so temperature and top-k/p see the constrained distribution. The masks
    work on a float32 copy, so the caller's logits stay the model's (a row-by-row retry sees them too).
    """
    logits = logits.to(torch.float32, copy=True)
    wanted = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
    raw = torch.log_softmax(logits[wanted], dim=-1) if wanted and logprobs_mode == "raw" else None
    _apply_logit_bias(logits, requests)
    if bitmask is not None:
        apply_bitmask_(logits, bitmask)
    _apply_penalties(logits, requests)
    _apply_masks(logits, requests, eos_ids)
    tokens = logits.argmax(dim=-1)
    random_rows = [i for i, r in enumerate(requests) if not r.params.greedy]
    processed: torch.Tensor | None = None
    if wanted and raw is None:
        processed = torch.log_softmax(logits, dim=-1)  # greedy rows: masks and penalties only
    if random_rows:
        rows = torch.tensor(random_rows, device=logits.device)
        picked, probs = _sample_random(logits[rows], [requests[i] for i in random_rows])
        tokens[rows] = picked
        if processed is not None:  # what the draw used: temperature, top-k/p, min-p, renormalized
            processed[rows] = torch.log(probs / probs.sum(dim=-1, keepdim=True))
    token_list: list[int] = tokens.tolist()
    chosen = raw if raw is not None else (processed[wanted] if processed is not None else None)
    return token_list, _logprobs(chosen, wanted, requests, token_list)


def sample_seed(seed: int, sample: int) -> int:
    """The seed of sample ``sample`` of an ``n > 1`` request seeded with ``seed``: sample 0 keeps the
    request's seed (so it equals the same request with ``n=1``), the others get their own stream,
    derived from (seed, sample) only, so every sample stays batch-invariant."""
    return seed if sample == 0 else position_seed(seed, (1 << 62) + sample)


def _apply_logit_bias(logits: torch.Tensor, requests: list[Request]) -> None:
    """Every request's ``logit_bias`` added in place, in one op. Ids were checked against the model's
    vocabulary; a draft model with a smaller one skips the ids it does not have (it only proposes)."""
    rows: list[int] = []
    ids: list[int] = []
    values: list[float] = []
    width = logits.shape[-1]
    for i, req in enumerate(requests):
        if not req.params.logit_bias:
            continue
        tokens, bias = req.params.logit_bias_items
        for token, value in zip(tokens, bias):
            if token < width:
                rows.append(i)
                ids.append(token)
                values.append(value)
    if rows:
        dev = logits.device
        index = (torch.tensor(rows, device=dev), torch.tensor(ids, device=dev))
        logits.index_put_(index, torch.tensor(values, device=dev, dtype=logits.dtype), accumulate=True)


def _apply_penalties(logits: torch.Tensor, requests: list[Request]) -> None:
    """Repetition, presence and frequency penalties, in place, from each request's own tokens only
    (so a request samples the same alone or in any batch)."""
    vocab = logits.shape[-1]
    for i, req in enumerate(requests):
        p = req.params
        if not p.has_penalties:
            continue
        row = logits[i]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(
                sorted({t for t in req.token_ids if t < vocab}), device=logits.device, dtype=torch.long
            )
            values = row[seen]
            row[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        output = [t for t in req.output_token_ids if t < vocab]
        if output and (p.presence_penalty or p.frequency_penalty):
            counts = torch.bincount(torch.tensor(output, device=logits.device), minlength=vocab)[:vocab].to(
                row.dtype
            )
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)


def _apply_masks(logits: torch.Tensor, requests: list[Request], eos_ids: tuple[int, ...]) -> None:
    """Per-request bans, in place: stop tokens (EOS unless ignored) until ``min_tokens`` are out."""
    for i, req in enumerate(requests):
        if req.num_output_tokens < req.params.min_tokens:
            banned = list(req.params.stop_token_ids) + ([] if req.params.ignore_eos else list(eos_ids))
            if banned:
                logits[i, banned] = float("-inf")


def _sample_random(logits: torch.Tensor, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
    """The drawn tokens, and the (unnormalized after min-p) probabilities they were drawn from."""
    dev = logits.device
    vocab = logits.shape[-1]
    temps = torch.tensor([float(r.params.temperature) for r in requests], device=dev)[:, None]
    scaled = logits / temps
    top_k = [min(r.params.top_k, vocab) if r.params.top_k > 0 else vocab for r in requests]
    top_p = [float(r.params.top_p) for r in requests]
    min_p = [float(r.params.min_p) for r in requests]
    if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
        scaled = _top_k_top_p(scaled, top_k, top_p)
    probs = torch.softmax(scaled, dim=-1)
    if any(p > 0 for p in min_p):
        floor = torch.tensor(min_p, device=dev)[:, None] * probs.max(dim=-1, keepdim=True).values
        probs = torch.where(probs < floor, torch.zeros_like(probs), probs)
    noise = torch.empty_like(probs)
    for i, req in enumerate(requests):
        gen = torch.Generator(device=dev).manual_seed(position_seed(req.seed, req.num_tokens))
        noise[i].exponential_(generator=gen)
    return (probs / noise).argmax(dim=-1), probs  # exponential race == categorical draw


def _top_k_top_p(scaled: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """``top_k`` already clamped to [1, vocab] (a k above the vocabulary keeps every token)."""
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    vocab = scaled.shape[-1]
    ranks = torch.arange(vocab, device=scaled.device)[None, :]
    k = torch.tensor(top_k, device=scaled.device)[:, None]
    sorted_logits = sorted_logits.masked_fill(ranks >= k, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass strictly before each token
    p = torch.tensor(top_p, device=scaled.device)[:, None]
    sorted_logits = sorted_logits.masked_fill((before >= p) & (ranks > 0), float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)


def _logprobs(
    lp: torch.Tensor | None, wanted: list[int], requests: list[Request], tokens: list[int]
) -> list[TokenLogprob | None]:
    """``lp`` holds the log-probs of the ``wanted`` rows."""
    out: list[TokenLogprob | None] = [None] * len(requests)
    if not wanted or lp is None:
        return out
    records = logprob_records(
        lp, [tokens[i] for i in wanted], [requests[i].params.logprobs or 0 for i in wanted]
    )
    for i, record in zip(wanted, records):
        out[i] = record
    return out


def logprob_records(lp: torch.Tensor, tokens: list[int], ks: list[int]) -> list[TokenLogprob]:
    """Per row of log-probs ``lp``: the token's log-prob, its rank (1 + the number of tokens strictly
    more likely, as vLLM counts) and the ``ks[row]`` most likely alternatives."""
    picked = torch.tensor(tokens, device=lp.device)[:, None]
    token_lp = lp.gather(1, picked)
    ranks = ((lp > token_lp).sum(dim=-1) + 1).tolist()
    values = token_lp[:, 0].tolist()
    k_max = max(ks, default=0)
    top = lp.topk(k_max, dim=-1) if k_max else None
    out = []
    for row, (token, k) in enumerate(zip(tokens, ks)):
        alternatives: tuple[tuple[int, float], ...] = ()
        if k and top is not None:
            alternatives = tuple(zip(top.indices[row, :k].tolist(), top.values[row, :k].tolist()))
        out.append(TokenLogprob(token, values[row], alternatives, ranks[row]))
    return out

"""Structured outputs inside one engine: compiled grammars (cached), a matcher per constrained request,
and each step's token bitmask, filled on a worker thread while the model computes the step (or in
line, when fills are too cheap to be worth the hand-off).

A request's matcher has consumed exactly its output tokens. Preemption recomputes KV but keeps the
tokens, so the matcher needs no rollback; prefix-cache hits touch only the prompt, which the matcher
never sees; and a request's mask depends on its own tokens only, so seeded sampling stays
batch-invariant.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from prefixflow.engine.core.request import Request
from prefixflow.engine.cpu_threads import grammar_threads
from prefixflow.engine.structured.backend import (
    GrammarError,
    StructuredOutputsUnavailable,
    build_grammar,
    clean_message,
    tokenizer_info,
    xgrammar,
)
from prefixflow.engine.structured.bitmask import allocate_bitmask
from prefixflow.engine.structured.params import StructuredOutputs

MAX_CACHED_GRAMMARS = 256
OVERLAP_ABOVE_S = 0.5e-3  # fills cheaper than a thread hand-off run in line (measured: tiny models lose ~8%)


class StructuredOutputManager:
    """Built with the engine; touches the grammar engine only when the first constrained request arrives."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...], max_rows: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.max_rows = max_rows
        self._compiler: Any = None
        self._batch: Any = None
        self._info: Any = None
        self._token_bytes: list[bytes] | None = None
        self._compiled: OrderedDict[tuple[str, str, bool], Any] = OrderedDict()
        self._worker: ThreadPoolExecutor | None = None
        self._bitmask: torch.Tensor | None = None
        self._pending: tuple[_FillPlan, Future[float] | None] | None = None
        self._fill_estimate_s = 0.0  # moving average of fill times: decides whether to overlap
        self.fill_s = 0.0  # time spent filling masks (worker or in line)
        # time the step loop spent on masks (in-line fills, waits for the worker): the part not hidden
        self.wait_s = 0.0
        self.masked_steps = 0
        self.overlapped_steps = 0  # steps whose fill ran on the worker while the model ran

    # -- compilation ------------------------------------------------------------------------------
    def _ensure_backend(self) -> None:
        if self._compiler is None:
            xgr = xgrammar()
            info = self._info = tokenizer_info(self.tokenizer, self.vocab_size, self.eos_ids)
            threads = grammar_threads()  # the cores torch's compute pool leaves free
            self._compiler = xgr.GrammarCompiler(info, max_threads=threads)
            self._batch = xgr.BatchGrammarMatcher(max_threads=threads)

    def token_bytes(self) -> list[bytes]:
        """Each token id's bytes as the grammar engine sees them (special tokens empty): what a forced
        literal's split is matched against (speculative/forced.py). Built once, on first use."""
        if self._token_bytes is None:
            self._ensure_backend()
            self._token_bytes = list(self._info.decoded_vocab)
        return self._token_bytes

    def compile(self, so: StructuredOutputs) -> Any:
        """The compiled grammar for this constraint; raises GrammarError / StructuredOutputsUnavailable."""
        key = so.cache_key
        compiled = self._compiled.get(key)
        if compiled is not None:
            self._compiled.move_to_end(key)
            return compiled
        grammar = build_grammar(so)
        self._ensure_backend()
        try:
            compiled = self._compiler.compile_grammar(grammar)
        except RuntimeError as exc:
            raise GrammarError(
                f"cannot compile the {so.kind.replace('_', ' ')}: {clean_message(exc)}"
            ) from None
        self._compiled[key] = compiled
        if len(self._compiled) > MAX_CACHED_GRAMMARS:
            self._compiled.popitem(last=False)
        return compiled

    def error(self, so: StructuredOutputs) -> str | None:
        """Why a request with this constraint cannot run, or None (compiles it, so the cache is warm)."""
        try:
            self.compile(so)
        except (GrammarError, StructuredOutputsUnavailable) as exc:
            return f"structured outputs: {exc}"
        return None

    def new_matcher(self, so: StructuredOutputs) -> Any:
        return xgrammar().GrammarMatcher(self.compile(so))

    # -- per step ----------------------------------------------------------------------------------
    def start_fill(self, requests: list[Request]) -> None:
        """Plan this step's bitmask for the constrained requests among ``requests`` (the rows the sampler
        will see, in order). When fills cost more than a thread hand-off, start it on the worker now, so
        it runs while the model computes the step; cheap fills (few requests, small vocabularies) are
        done in line by ``take_bitmask``, where the hand-off would cost more than it hides."""
        self._pending = None
        plan = self._plan(requests)
        if plan is None:
            return
        future: Future[float] | None = None
        if self._fill_estimate_s >= OVERLAP_ABOVE_S:
            if self._worker is None:
                self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefixflow-grammar")
            future = self._worker.submit(self._fill, plan)
            self.overlapped_steps += 1
        self._pending = (plan, future)

    def take_bitmask(self, requests: list[Request]) -> torch.Tensor | None:
        """The filled bitmask for exactly these sampler rows (None when none is constrained)."""
        start = time.perf_counter()
        pending, self._pending = self._pending, None
        plan, future = pending if pending is not None else (None, None)
        if future is not None:
            self._record_fill(future.result())  # always waited for: the buffer is reused
        if (
            plan is None
            or len(plan.requests) != len(requests)
            or any(a is not b for a, b in zip(plan.requests, requests))
        ):  # other rows than planned (a step retried request by request): plan and fill in line
            plan, future = self._plan(requests), None
            if plan is None:
                return None
        if future is None:
            self._record_fill(self._fill(plan))
        self.wait_s += time.perf_counter() - start
        self.masked_steps += 1
        return plan.bitmask

    def _plan(self, requests: list[Request]) -> _FillPlan | None:
        rows = [i for i, r in enumerate(requests) if r.grammar is not None]
        if not rows:
            return None
        n = len(requests)
        if self._bitmask is None or self._bitmask.shape[0] < n:
            self._bitmask = allocate_bitmask(max(n, self.max_rows), self.vocab_size)
        bitmask = self._bitmask[:n]
        bitmask.fill_(-1)  # unconstrained rows: everything allowed
        return _FillPlan(list(requests), [requests[i].grammar for i in rows], rows, bitmask)

    def _fill(self, plan: _FillPlan) -> float:
        start = time.perf_counter()
        self._batch.batch_fill_next_token_bitmask(plan.matchers, plan.bitmask, plan.rows)
        return time.perf_counter() - start

    def _record_fill(self, seconds: float) -> None:
        self.fill_s += seconds
        self._fill_estimate_s = 0.8 * self._fill_estimate_s + 0.2 * seconds


@dataclass(frozen=True)
class _FillPlan:
    """One step's fill: the sampler's rows, the matchers of the constrained ones and where they go."""

    requests: list[Request]
    matchers: list[Any]
    rows: list[int]
    bitmask: torch.Tensor

"""Structured outputs inside one engine: compiled grammars (cached), a matcher per constrained request,
and each step's token bitmask, filled on a worker thread while the model computes the step.

A request's matcher has consumed exactly its output tokens. Preemption recomputes KV but keeps the
tokens, so the matcher needs no rollback; prefix-cache hits touch only the prompt, which the matcher
never sees; and a request's mask depends on its own tokens only, so seeded sampling stays
batch-invariant.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from prefixflow.engine.request import Request
from prefixflow.engine.structured.backend import (
    GrammarError,
    StructuredOutputsUnavailable,
    build_grammar,
    tokenizer_info,
    xgrammar,
)
from prefixflow.engine.structured.bitmask import allocate_bitmask
from prefixflow.engine.structured.params import StructuredOutputs

MAX_CACHED_GRAMMARS = 256


class StructuredOutputManager:
    """Built with the engine; touches the grammar engine only when the first constrained request arrives."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...], max_rows: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.max_rows = max_rows
        self._compiler: Any = None
        self._batch: Any = None
        self._compiled: OrderedDict[tuple[str, str, bool], Any] = OrderedDict()
        self._worker: ThreadPoolExecutor | None = None
        self._bitmask: torch.Tensor | None = None
        self._pending: tuple[list[Request], Future[float]] | None = None
        self.fill_s = 0.0  # worker time spent filling masks
        self.wait_s = 0.0  # time the step loop waited for a fill (the part not hidden behind the model)
        self.masked_steps = 0

    # -- compilation ------------------------------------------------------------------------------
    def _ensure_backend(self) -> None:
        if self._compiler is None:
            xgr = xgrammar()
            info = tokenizer_info(self.tokenizer, self.vocab_size, self.eos_ids)
            threads = max(1, min(8, (os.cpu_count() or 2) // 2))
            self._compiler = xgr.GrammarCompiler(info, max_threads=threads)
            self._batch = xgr.BatchGrammarMatcher(max_threads=threads)

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
            raise GrammarError(f"cannot compile the {so.kind.replace('_', ' ')}: {exc}") from None
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
        """Begin filling the bitmask rows of the constrained requests among ``requests`` (the rows the
        sampler will see, in order) on the worker thread; the model runs meanwhile."""
        self._pending = None
        rows = [i for i, r in enumerate(requests) if r.grammar is not None]
        if not rows:
            return
        n = len(requests)
        if self._bitmask is None or self._bitmask.shape[0] < n:
            self._bitmask = allocate_bitmask(max(n, self.max_rows), self.vocab_size)
        bitmask = self._bitmask[:n]
        bitmask.fill_(-1)  # unconstrained rows: everything allowed
        matchers = [requests[i].grammar for i in rows]
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefixflow-grammar")
        self._pending = (list(requests), self._worker.submit(self._fill, matchers, bitmask, rows))

    def _fill(self, matchers: list[Any], bitmask: torch.Tensor, rows: list[int]) -> float:
        start = time.perf_counter()
        self._batch.batch_fill_next_token_bitmask(matchers, bitmask, rows)
        return time.perf_counter() - start

    def take_bitmask(self, requests: list[Request]) -> torch.Tensor | None:
        """The filled bitmask for exactly these sampler rows (None when none is constrained)."""
        pending, self._pending = self._pending, None
        start = time.perf_counter()
        if pending is not None:
            planned, future = pending
            self.fill_s += future.result()
            if len(planned) != len(requests) or any(a is not b for a, b in zip(planned, requests)):
                pending = None  # the runner sampled other rows than planned: fill again, in line
        if pending is None:
            if all(r.grammar is None for r in requests):
                return None
            self.start_fill(requests)
            assert self._pending is not None
            self.fill_s += self._pending[1].result()
            self._pending = None
        self.wait_s += time.perf_counter() - start
        self.masked_steps += 1
        assert self._bitmask is not None
        return self._bitmask[: len(requests)]

    @staticmethod
    def accept(req: Request, token: int) -> bool:
        """Advance the request's matcher; False means the grammar rejected the token (a bug, not user error)."""
        return bool(req.grammar.accept_token(token))

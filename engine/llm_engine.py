"""The step loop: schedule, run the model, sample, finish requests. One object per loaded model."""

from __future__ import annotations

import time

from prefixflow.engine.config import EngineConfig
from prefixflow.engine.kv_cache_manager import KVCacheManager
from prefixflow.engine.loader import resolve_model
from prefixflow.engine.model_config import ModelConfig
from prefixflow.engine.model_runner import ModelRunner
from prefixflow.engine.model_source import ModelSource
from prefixflow.engine.outputs import RequestOutput
from prefixflow.engine.request import Request
from prefixflow.engine.sampler import position_seed, sample
from prefixflow.engine.sampling_params import SamplingParams
from prefixflow.engine.scheduler import Scheduler, SchedulerLimits
from prefixflow.engine.stats import EngineStats
from prefixflow.engine.stop_checker import StopChecker
from prefixflow.engine.structured.manager import StructuredOutputManager


class LLMEngine:
    def __init__(self, cfg: EngineConfig, model: str | ModelSource | None = None) -> None:
        self.cfg = cfg
        self.source = resolve_model(model if model is not None else cfg.model)
        self.model_cfg = ModelConfig.from_hf(self.source.hf_config)
        self.tokenizer = self.source.tokenizer
        limits = [self.model_cfg.max_position_embeddings]
        if cfg.max_model_len is not None:
            limits.append(cfg.max_model_len)
        if self.model_cfg.sliding_window:
            limits.append(self.model_cfg.sliding_window)  # within the window, full attention is exact
        self.runner = ModelRunner(self.source, self.model_cfg, cfg, min(limits))
        self.kv = KVCacheManager(self.runner.num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        self.max_model_len = min(*limits, self.runner.num_blocks * cfg.block_size)
        self.scheduler = Scheduler(SchedulerLimits(cfg.max_num_seqs, cfg.max_num_batched_tokens), self.kv)
        self.eos_ids = tuple(self.source.eos_token_ids)
        self.stop_checker = StopChecker(self.tokenizer, self.eos_ids, self.max_model_len)
        self.structured = StructuredOutputManager(
            self.tokenizer, self.model_cfg.vocab_size, self.eos_ids, cfg.max_num_seqs
        )
        self.stats = EngineStats()
        self._seed_counter = 0

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> str | None:
        """Why this request can never run, or None. Checked before it joins the queue."""
        problem = params.validation_error()
        if problem:
            return f"invalid sampling parameters: {problem}"
        if not prompt_ids:
            return "empty prompt"
        vocab = self.model_cfg.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            return f"prompt has token ids outside the vocabulary [0, {vocab})"
        n = len(prompt_ids)
        if n >= self.max_model_len:
            return f"prompt has {n} tokens; the limit is {self.max_model_len - 1} (max_model_len {self.max_model_len})"
        if params.max_tokens is not None and n + params.max_tokens > self.max_model_len:
            return (
                f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) exceeds max_model_len "
                f"{self.max_model_len} (bounded by the model and the KV pool)"
            )
        if params.structured is not None:
            return self.structured.error(params.structured)
        return None

    def add_request(
        self,
        index: int,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        score_start: int | None = None,
    ) -> Request:
        seed = params.seed
        if seed is None:
            seed = position_seed(self.cfg.seed, self._seed_counter)
            self._seed_counter += 1
        max_tokens = params.max_tokens or (self.max_model_len - len(prompt_ids))
        req = Request(index, request_id, list(prompt_ids), params, max_tokens, seed, score_start)
        if params.structured is not None:
            req.grammar = self.structured.new_matcher(params.structured)
        self.scheduler.add(req)
        self.stats.requests += 1
        self.stats.prompt_tokens += len(prompt_ids)
        return req

    def abort_all(self) -> int:
        """Drop every queued and running request, returning their blocks to the pool."""
        dropped = len(self.scheduler.waiting) + len(self.scheduler.running)
        for req in list(self.scheduler.running):
            self.scheduler.finish(req)
        self.scheduler.waiting.clear()
        return dropped

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        scheduled = self.scheduler.schedule()
        if not scheduled:
            raise RuntimeError("scheduler made no progress (no request fits the KV pool)")
        self.structured.start_fill(_sampling_rows(scheduled))  # on a worker, while the model runs
        host = time.perf_counter() - start
        result = self.runner.execute(scheduled)
        host += self.runner.last_prepare_s
        finished: list[RequestOutput] = []
        for req, n in scheduled:
            prompt_part = min(req.num_computed_tokens + n, req.num_prompt_tokens) - req.num_computed_tokens
            self.stats.computed_prompt_tokens += max(0, prompt_part)
            req.num_computed_tokens += n
            self.kv.commit_computed(req)
            if req.score_start is not None:
                req.score += result.scores.get(req.index, 0.0)
                if req.num_computed_tokens == req.num_tokens:
                    finished.append(self._finish(req, "stop", None))
        now = time.perf_counter()
        if result.sample_requests:
            bitmask = self.structured.take_bitmask(result.sample_requests)
            tokens, logprobs = sample(result.logits, result.sample_requests, self.eos_ids, bitmask)
            now = time.perf_counter()
            for req, token, lp in zip(result.sample_requests, tokens, logprobs):
                req.token_ids.append(token)
                if req.grammar is not None and not self.structured.accept(req, token):
                    finished.append(self._fail(req, f"structured outputs: the grammar rejected token {token}"))
                    continue
                if lp is not None:
                    req.logprobs.append(lp)
                if req.first_token_time is None:
                    req.first_token_time = now
                verdict = self.stop_checker.check(req)
                if verdict is not None:
                    finished.append(self._finish(req, *verdict))
        self.stats.steps += 1
        self.stats.preemptions = self.scheduler.num_preemptions
        so = self.structured
        self.stats.mask_fill_s, self.stats.mask_wait_s, self.stats.masked_steps = so.fill_s, so.wait_s, so.masked_steps
        end = time.perf_counter()
        self.stats.host_s += host + (end - now)  # the device idles while the host does this
        self.stats.elapsed_s += end - start
        return finished

    def _finish(self, req: Request, reason: str, stop_reason) -> RequestOutput:
        self.scheduler.finish(req)
        self.stats.cached_prompt_tokens += req.num_cached_tokens
        self.stats.output_tokens += req.num_output_tokens if req.score_start is None else 0
        now = time.perf_counter()
        out_ids = req.output_token_ids if req.score_start is None else []
        text = self.stop_checker.final_text(req, stop_reason) if out_ids else ""
        return RequestOutput(
            request_id=req.request_id,
            index=req.index,
            text=text,
            token_ids=tuple(out_ids),
            finish_reason=reason,
            prompt_token_ids=tuple(req.prompt_token_ids),
            num_prompt_tokens=req.num_prompt_tokens,
            num_cached_tokens=req.num_cached_tokens,
            num_output_tokens=len(out_ids),
            logprobs=tuple(req.logprobs) if req.params.logprobs is not None else None,
            time_to_first_token=(req.first_token_time - req.arrival_time) if req.first_token_time else None,
            latency=now - req.arrival_time,
            stop_reason=stop_reason,
            metadata={"score": req.score} if req.score_start is not None else {},
        )

    def _fail(self, req: Request, message: str) -> RequestOutput:
        """End a running request with an error output (its blocks go back to the pool)."""
        self.scheduler.finish(req)
        return self.error_output(req.index, req.request_id, req.prompt_token_ids, message)

    def error_output(self, index: int, request_id: str, prompt_ids: list[int], message: str) -> RequestOutput:
        self.stats.error_requests += 1
        return RequestOutput(
            request_id=request_id,
            index=index,
            text="",
            token_ids=(),
            finish_reason="error",
            error=message,
            prompt_token_ids=tuple(prompt_ids),
            num_prompt_tokens=len(prompt_ids),
        )


def _sampling_rows(scheduled: list[tuple[Request, int]]) -> list[Request]:
    """The requests that sample a token this step, in the order the model runner lists them: generation
    requests whose scheduled tokens reach the end of their token list."""
    return [r for r, n in scheduled if r.score_start is None and r.num_computed_tokens + n == r.num_tokens]

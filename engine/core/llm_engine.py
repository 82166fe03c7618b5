"""The step loop: schedule -> execute -> update. One object per loaded model.

The engine owns no request state of its own: the scheduler writes requests, the KV cache manager
owns block tables, the model runner owns device tensors. This file wires them and turns finished
requests into ``RequestOutput``s.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prefixflow.engine.config import EngineConfig
from prefixflow.engine.core.kv_cache_manager import KVCacheManager
from prefixflow.engine.core.lanes import LaneDriver
from prefixflow.engine.core.request import Request, RequestSpec, Status
from prefixflow.engine.core.scheduler import Scheduler, SchedulerLimits
from prefixflow.engine.core.stats import EngineStats
from prefixflow.engine.core.step_types import ModelOutput, SchedulerOutput
from prefixflow.engine.distributed.pipeline import split_for
from prefixflow.engine.distributed.pool import TensorParallelError
from prefixflow.engine.kv_offload.cost_model import CostModel
from prefixflow.engine.kv_offload.disk_files import write_atomic
from prefixflow.engine.kv_offload.disk_tier import DiskTier, disk_namespace
from prefixflow.engine.loading.loader import resolve_model
from prefixflow.engine.loading.model_config import ModelConfig
from prefixflow.engine.loading.model_identity import identity_of, memory_identity
from prefixflow.engine.loading.model_source import ModelSource
from prefixflow.engine.outputs import RequestOutput
from prefixflow.engine.runner.model_runner import ModelRunner, pipeline_lanes
from prefixflow.engine.sampling.logprob_view import LogprobView
from prefixflow.engine.sampling.sampler import position_seed
from prefixflow.engine.sampling.sampling_params import SamplingParams
from prefixflow.engine.sampling.stop_checker import StopChecker
from prefixflow.engine.speculative.build import build_speculator
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
        cost = CostModel.for_model(
            self.model_cfg, self.runner.shard.dtype.itemsize, self.runner.shard.device.type
        )
        self.kv = KVCacheManager(
            self.runner.num_blocks,
            cfg.block_size,
            cfg.enable_prefix_caching,
            host_blocks=self.runner.shard.host_kv.num_blocks,
            cost=cost,
        )
        self.max_model_len = min(*limits, self.runner.num_blocks * cfg.block_size)
        self.kv_bytes_per_block = (
            self.model_cfg.kv_bytes_per_token * self.runner.shard.dtype.itemsize * cfg.block_size
        )
        self.disk_namespace: dict[str, object] = {}
        self.eos_ids = tuple(self.source.eos_token_ids)
        self.stop_checker = StopChecker(self.tokenizer, self.eos_ids, self.max_model_len)
        self.logprob_view = LogprobView(self.tokenizer)
        self.scheduler = Scheduler(
            SchedulerLimits(cfg.max_num_seqs, cfg.max_num_batched_tokens),
            self.kv,
            self.stop_checker,
            lanes=pipeline_lanes(cfg) if self.runner.keeps_steps_in_flight else 1,
        )
        # PP virtual engines: one step in flight per lane (lanes.py); None: one step at a time
        self.lanes = (
            LaneDriver(self.scheduler, self.runner, self._run_copies)
            if self.runner.keeps_steps_in_flight
            else None
        )
        self.structured = StructuredOutputManager(
            self.tokenizer, self.model_cfg.vocab_size, self.eos_ids, cfg.max_num_seqs
        )
        self.stats = EngineStats(
            weight_bytes=self.runner.shard.weight_bytes, quantization=self.runner.shard.quantization.method
        )
        dtype = str(self.runner.shard.dtype).removeprefix("torch.")
        loc = self.source.location
        # What describe_model(model, dtype, device, quantization) reports for this model: the same function.
        self.model_identity = (
            identity_of(
                loc, dtype, cfg.quantization, cfg.sparsity, self.runner.shard.device.type, cfg.cpu_int8
            )
            if loc is not None
            else memory_identity(
                self.source.name,
                self.source.identity,
                dtype,
                self.source.hf_config,
                cfg.quantization,
                cfg.sparsity,
                self.runner.shard.device.type,
                cfg.cpu_int8,
            )
        )
        self._open_disk_tier(cost, dtype)
        self.speculator = build_speculator(
            cfg,
            self.source,
            self.max_model_len,
            self.scheduler.speculation,
            self.runner.num_blocks,
            self.structured.token_bytes,
        )
        # Called after every step with the engine's counters (live progress, throughput series): the
        # counts move per step, not when a request finishes.
        self.step_listeners: list[Callable[[EngineStats], None]] = []
        self._seed_counter = 0
        self._stepping = False
        self._deferred_aborts: set[int] = set()

    def _open_disk_tier(self, cost: CostModel, dtype: str) -> None:
        """``kv_cache_dir``: every rank opens its store under the namespace of this model run the way it
        runs here (kv_offload/disk_tier.py); the host tier is its staging area."""
        cfg, host = self.cfg, self.kv.host
        if cfg.kv_cache_dir is None or host is None:
            return
        root = Path(cfg.kv_cache_dir)
        try:
            root.mkdir(parents=True, exist_ok=True)
            problem = None if os.access(root, os.W_OK | os.X_OK) else "not writable"
        except OSError as exc:
            problem = str(exc)
        if problem is not None:
            self.runner.close()
            raise ValueError(
                f"EngineConfig.kv_cache_dir={cfg.kv_cache_dir!r} cannot be used ({problem}); give a writable "
                "local directory, or leave it unset to run without the persistent KV tier"
            )
        pp = cfg.pipeline_parallel_size
        stages = split_for(self.model_cfg, pp) if pp > 1 else [(0, self.model_cfg.num_layers)]
        namespace, self.disk_namespace = disk_namespace(
            str(self.model_identity["digest"]),
            self.model_cfg,
            dtype,
            cfg.block_size,
            cfg.tensor_parallel_size,
            pp,
            stages,
            self.runner.shard.ops.name,
            self.runner.shard.device.type,
        )
        self.runner.open_disk(namespace)
        host.disk = DiskTier(root, namespace, cost, self.runner.load_from_disk)
        about = host.disk.folder / "namespace.json"
        if not about.exists():  # what the files were made by, for whoever finds the directory
            write_atomic(
                about, [json.dumps(self.disk_namespace, indent=1, sort_keys=True, default=str).encode()]
            )

    def validate(self, prompt_ids: list[int], params: object) -> str | None:
        """Why this request can never run, or None. Checked before it joins the queue, against this
        model (vocabulary, context limit); never raises, so a bad request is an error output."""
        try:
            return self._problem(prompt_ids, params)
        except Exception as exc:  # a value odd enough to break a check is still only this request's
            return f"invalid request: {exc!r}"

    def _problem(self, prompt_ids: list[int], params: object) -> str | None:
        if not isinstance(params, SamplingParams):
            return f"params must be a SamplingParams, got {type(params).__name__}"
        vocab = self.model_cfg.vocab_size
        problem = params.validation_error(vocab)
        if problem:
            return f"invalid sampling parameters: {problem}"
        if not prompt_ids:
            return "empty prompt"
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
            return self.structured.error(params.structured)  # compiles it: a bad schema or regex ends here
        return None

    def add_request(self, spec: RequestSpec) -> int:
        """Queue a validated request; returns its engine-wide key (``step`` results are keyed by it)."""
        seed = spec.params.seed
        if seed is None:
            seed = position_seed(self.cfg.seed, self._seed_counter)
            self._seed_counter += 1
        n = len(spec.prompt_token_ids)
        if spec.score_from is not None:
            max_tokens = 0  # a scoring request only computes its prompt
        else:
            max_tokens = spec.params.max_tokens or (self.max_model_len - n)
        req = Request(
            spec.index,
            spec.request_id,
            list(spec.prompt_token_ids),
            spec.params,
            max_tokens,
            seed,
            spec.score_from,
        )
        if spec.params.structured is not None and max_tokens > 0:
            req.grammar = self.structured.new_matcher(spec.params.structured)
        self.scheduler.add(req)
        self.stats.requests += 1
        self.stats.prompt_tokens += n
        return req.key

    def abort(self, keys: Iterable[int]) -> None:
        """Drop these requests and free their blocks (after the current step, if one is running)."""
        if self._stepping:
            self._deferred_aborts.update(keys)
        else:
            self.scheduler.abort(keys)
            self._retire_orphans()

    def abort_all(self) -> int:
        """Drop every queued and running request, returning their blocks to the pool."""
        dropped = self.scheduler.abort_all()
        self._retire_orphans()
        return dropped

    def _retire_orphans(self) -> None:
        """Steps still in flight whose requests were all aborted: let them land now (nobody would
        step again to finish them), so no stage is left mid-step while the engine idles."""
        if self.lanes is None or self.scheduler.has_work():
            return
        while self.lanes.busy:
            current = self.lanes.oldest()
            self.runner.finish(current.launched)  # no request is running: nothing to update
            self.stats.steps += 1

    def _run_copies(self) -> None:
        copies = self.kv.take_copies()
        if copies:
            self.runner.copy_blocks(copies)

    def close(self) -> None:
        """Release the tensor-parallel workers, after the disk tier's pending writes; the engine cannot
        step afterwards. Idempotent."""
        try:
            self._drain_copies()
        finally:
            self.runner.close()

    def _drain_copies(self) -> None:
        """Run copies planned after the last step (the disk tier's writes of its last computed blocks)."""
        if self.runner.shard.host_kv.disk is None:
            return
        copies = self.kv.take_copies()
        if copies:
            self.runner.copy_blocks(copies)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or (self.lanes is not None and self.lanes.busy)

    def num_unfinished(self) -> int:
        return self.scheduler.num_unfinished()

    def step(self) -> dict[int, RequestOutput]:
        """One step: schedule, execute, update. Returns the requests that finished, by key."""
        start = time.perf_counter()
        self._stepping = True
        features: list[float] | None = None
        try:
            if self.lanes is not None:  # PP virtual engines: start idle lanes' steps, finish the oldest
                self.lanes.fill()
                current = self.lanes.oldest()
                scheduled = current.scheduled
                self.structured.start_fill(sampling_requests(scheduled))  # while its logits arrive
                host = time.perf_counter() - start
                output = self._execute(
                    scheduled, lambda: self.runner.finish(current.launched, self.structured)
                )
            else:
                if self.speculator is not None:
                    self.speculator.propose(
                        self.scheduler.running,
                        self.cfg.max_num_batched_tokens,
                        waiting=bool(self.scheduler.waiting),
                    )
                scheduled = self.scheduler.schedule()
                if not scheduled:
                    raise RuntimeError("scheduler made no progress (no request fits the KV pool)")
                if self.speculator is not None:  # last prompt chunks verify drafts of the first tokens too
                    drafts = self.speculator.prefill_drafts(scheduled)
                    if drafts:
                        scheduled = self.scheduler.attach_drafts(scheduled, drafts)
                self._run_copies()
                features = self.speculator.features(scheduled) if self.speculator is not None else None
                self.structured.start_fill(sampling_requests(scheduled))  # on a worker while the model runs
                host = time.perf_counter() - start
                output = self._execute(scheduled)
            host += self.runner.last_prepare_s
            update_start = time.perf_counter()
            self._count_prompt_work(scheduled)
            # real outputs only: a verified run's drafts sit in token_ids until update_from_output settles them
            outputs_before = sum(c.request.num_output_tokens - c.request.num_draft_tokens for c in scheduled)
            done = self.scheduler.update_from_output(scheduled, output)
            if self.speculator is not None and done:
                self.speculator.finished(done)
            finished = {req.key: self._output(req) for req in done}
            # tokens taken this step (a verified speculative run may take several per request)
            self.stats.generated_tokens += (
                sum(c.request.num_output_tokens for c in scheduled) - outputs_before
            )
        finally:
            self._stepping = False
            if self._deferred_aborts:
                self.scheduler.abort(self._deferred_aborts)
                self._deferred_aborts.clear()
                self._retire_orphans()
        if not self.scheduler.has_work():
            self._drain_copies()  # no next step would run them
        self.stats.steps += 1
        self.stats.preemptions = self.scheduler.num_preemptions
        self._count_tier_work()
        so = self.structured
        self.stats.mask_fill_s, self.stats.mask_wait_s, self.stats.masked_steps = (
            so.fill_s,
            so.wait_s,
            so.masked_steps,
        )
        self.stats.mask_overlapped_steps = so.overlapped_steps
        end = time.perf_counter()
        self.stats.host_s += host + (end - update_start)  # the device idles while the host does this
        self.stats.elapsed_s += end - start
        if self.speculator is not None and features is not None:
            self.speculator.observe(features, end - start, self.scheduler.running)
            self.stats.speculation = self.scheduler.speculation.as_dict()
        for listener in list(self.step_listeners):
            listener(self.stats)
        return finished

    def _execute(
        self, scheduled: SchedulerOutput, first: Callable[[], ModelOutput] | None = None
    ) -> ModelOutput:
        """Run the step (``first``: how, when it was started already); if it fails, run each request
        alone so a request-specific failure becomes that request's error. When every request fails
        alone too, the fault is not any one request's (device, memory): it is raised, so a job stops
        and can resume, instead of turning every row into an error result."""
        try:
            if first is not None:
                return first()
            return self.runner.execute(scheduled, self.structured)
        except TensorParallelError:
            raise  # the ranks are out of step: no request can run again on this engine
        except Exception as batch_error:
            if len(scheduled) == 1:
                raise
            merged, failures = ModelOutput(), 0
            for chunk in scheduled:
                try:
                    merged.merge(self.runner.execute(scheduled.only(chunk), self.structured))
                except Exception as exc:
                    failures += 1
                    merged.errors[chunk.request.key] = f"model step failed: {exc!r}"
            if failures == len(scheduled):
                raise batch_error
            return merged

    def _count_tier_work(self) -> None:
        host = self.kv.host
        if host is None:
            return
        c, bs = host.counters, self.cfg.block_size
        self.stats.kv_host_blocks = host.pool.num_blocks
        self.stats.kv_offloaded_tokens, self.stats.kv_reloaded_tokens = (
            c.offloaded_blocks * bs,
            c.reloaded_blocks * bs,
        )
        self.stats.kv_host_lookups, self.stats.kv_host_hits = c.host_lookups, c.host_hits
        if host.disk is not None:
            d, kv_bytes = host.disk.counters, self.kv_bytes_per_block
            store = self.runner.shard.host_kv.disk
            self.stats.kv_disk_lookups, self.stats.kv_disk_hits = d.lookups, d.loaded_blocks
            self.stats.kv_disk_loaded_tokens, self.stats.kv_disk_read_bytes = (
                d.loaded_blocks * bs,
                d.loaded_blocks * kv_bytes,
            )
            self.stats.kv_disk_declined_tokens, self.stats.kv_disk_failed_blocks = (
                d.declined_blocks * bs,
                d.failed_blocks,
            )
            self.stats.kv_disk_written_tokens, self.stats.kv_disk_written_bytes = (
                d.written_blocks * bs,
                d.written_blocks * kv_bytes,
            )
            if store is not None:
                self.stats.kv_disk_corrupt_files = store.counters.corrupt_blocks

    def _count_prompt_work(self, scheduled: SchedulerOutput) -> None:
        for chunk in scheduled:
            req = chunk.request
            redo = min(req.num_computed_tokens + chunk.num_tokens, req.num_computed_before_preemption)
            self.stats.kv_recomputed_tokens += max(0, redo - req.num_computed_tokens)
            done = min(req.num_computed_tokens + chunk.num_tokens, req.num_prompt_tokens)
            self.stats.computed_prompt_tokens += max(0, done - req.num_computed_tokens)

    def _output(self, req: Request) -> RequestOutput:
        assert req.status is Status.FINISHED and req.finish_reason is not None
        if req.finish_reason == "error":
            return self.error_output(req.index, req.request_id, req.prompt_token_ids, req.error or "error")
        out_ids = req.output_token_ids
        try:
            text = self.stop_checker.final_text(req, req.stop_reason) if out_ids else ""
        except Exception as exc:
            return self.error_output(
                req.index, req.request_id, req.prompt_token_ids, f"detokenizing failed: {exc!r}"
            )
        self.stats.cached_prompt_tokens += req.num_cached_tokens
        self.stats.output_tokens += len(out_ids)
        now = time.perf_counter()
        return RequestOutput(
            request_id=req.request_id,
            index=req.index,
            text=text,
            token_ids=tuple(out_ids),
            finish_reason=req.finish_reason,
            prompt_token_ids=tuple(req.prompt_token_ids),
            num_prompt_tokens=req.num_prompt_tokens,
            num_cached_tokens=req.num_cached_tokens,
            num_output_tokens=len(out_ids),
            logprobs=self.logprob_view.sample(req.logprobs) if req.params.logprobs is not None else None,
            prompt_logprobs=(
                self.logprob_view.prompt(req.prompt_logprobs, req.num_prompt_tokens)
                if req.params.prompt_logprobs is not None
                else None
            ),
            time_to_first_token=(req.first_token_time - req.arrival_time) if req.first_token_time else None,
            latency=now - req.arrival_time,
            stop_reason=req.stop_reason,
            metadata={"score": req.prompt_logprob_sum} if req.score_from is not None else {},
        )

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


def sampling_requests(scheduled: SchedulerOutput) -> list[Request]:
    """The requests that sample a token this step, in the model runner's row order: generating requests
    whose chunk reaches the end of their tokens (as ``build_step_inputs`` lists them)."""
    return [
        c.request
        for c in scheduled
        if c.request.generates and c.request.num_computed_tokens + c.num_tokens == c.request.num_tokens
    ]

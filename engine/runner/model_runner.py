"""Rank 0's side of a step: flatten the scheduled requests, run every rank's shard, sample, score.

With ``tensor_parallel_size=1`` the one ``ModelShard`` lives here and runs directly. With N > 1 this
process holds rank 0's shard and a ``WorkerPool`` of N-1 worker processes; each step is broadcast to
them as one flat int64 tensor (no request objects), all ranks run the same forward pass, and the
logits of the rows that sample or score are gathered here, where alone they are used.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from prefixflow.engine.config import EngineConfig
from prefixflow.engine.core.step_types import ModelOutput, SchedulerOutput, TokenMasks
from prefixflow.engine.distributed.context import layout_for, single_rank
from prefixflow.engine.distributed.pipeline import split_for
from prefixflow.engine.distributed.pipeline_inflight import InFlightSteps
from prefixflow.engine.distributed.pipeline_step import StageWork, virtual_engines
from prefixflow.engine.distributed.pool import TensorParallelError, WorkerPool
from prefixflow.engine.distributed.step_payload import StepBatch, pack
from prefixflow.engine.kv_offload.copy_plan import CopyPlan
from prefixflow.engine.kv_offload.disk_tier import digest_words
from prefixflow.engine.loading.model_config import ModelConfig
from prefixflow.engine.loading.model_source import ModelSource
from prefixflow.engine.quantization import resolve_quantization
from prefixflow.engine.runner.model_shard import (
    COLLECTIVE_STATS,
    DISK_FLUSH,
    DISK_INIT,
    DISK_LOAD,
    INIT_CACHE,
    KV_COPY,
    PIPELINE_STATS,
    STEP,
    ModelShard,
    WorkerShardFactory,
    shard_context,
)
from prefixflow.engine.runner.step_inputs import StepInputs, block_table_array, build_step_inputs
from prefixflow.engine.sampling.sampler import logprob_records, sample_batch
from prefixflow.engine.speculative.verify import sample_verified

INIT_BOUND_S = 1800.0  # KV profiling and CUDA-graph capture (Triton compiles) on every rank


@dataclass(frozen=True)
class LaunchedStep:
    """A step rank 0 started and has not sampled yet (its logits come back later)."""

    step: StepInputs
    work: StageWork


def pipeline_lanes(cfg: EngineConfig) -> int:
    """How many lanes (virtual engines) the scheduler runs: 1 unless PP keeps steps in flight.
    Speculative decoding keeps one lane (its proposer reads every running request between steps)."""
    if cfg.pipeline_parallel_size == 1 or cfg.speculative_config is not None:
        return 1
    return virtual_engines(cfg)


class ModelRunner:
    def __init__(
        self,
        source: ModelSource,
        model_cfg: ModelConfig,
        cfg: EngineConfig,
        max_model_len: int,
    ) -> None:
        self.cfg = cfg
        self.model_cfg = model_cfg
        self.eos_ids = tuple(source.eos_token_ids)
        self.last_prepare_s = 0.0
        self.pool: WorkerPool | None = None
        self.in_flight: InFlightSteps | None = None  # steps started and not yet finished (PP lanes)
        resolve_quantization(
            source.hf_config, cfg.quantization, cfg.sparsity
        )  # a bad quantization fails before any work
        world = cfg.tensor_parallel_size * cfg.pipeline_parallel_size
        devices = rank_devices(cfg.device, world)
        if world == 1:
            self.shard = ModelShard(source, model_cfg, cfg, max_model_len, single_rank(model_cfg), devices[0])
            self.num_blocks = self.shard.init_cache()
            return
        for rank in range(
            cfg.tensor_parallel_size
        ):  # a model that cannot split fails here, before any process starts
            layout_for(model_cfg, rank, cfg.tensor_parallel_size)
        if cfg.pipeline_parallel_size > 1:
            split_for(model_cfg, cfg.pipeline_parallel_size)
        if source.location is None:
            raise ValueError(
                "tensor_parallel_size > 1 needs a model the worker processes can load themselves: a preset "
                "name, a Hugging Face directory or a .gguf path (an in-memory ModelSource cannot be shared)"
            )
        factory = WorkerShardFactory(source.location, cfg, max_model_len)
        self.pool = WorkerPool(world, devices, cfg.distributed_timeout_s, factory)
        try:
            tp, pp = shard_context(model_cfg, cfg, self.pool.group)  # rank 0 loads while the workers do
            self.shard = ModelShard(source, model_cfg, cfg, max_model_len, tp, devices[0], pp)
            self.pool.wait_ready()
            init = self.pool.run(
                self.shard, INIT_CACHE, torch.empty(0, dtype=torch.int64), bound_s=INIT_BOUND_S
            )
            self.num_blocks = int(init)  # type: ignore[call-overload]
            if pipeline_lanes(cfg) > 1:
                self.in_flight = InFlightSteps(self.pool, self.shard)
        except TensorParallelError as exc:
            self.pool.close()
            if isinstance(exc.__cause__, ValueError):  # a bad setting rank 0 found itself (a KV budget too
                raise exc.__cause__ from None  # small for one block): the config's fault, said as such
            raise
        except BaseException:
            self.pool.close()
            raise

    def copy_blocks(self, plan: CopyPlan) -> None:
        """Run a step's block copies on every rank, before that step's forward pass."""
        if self.pool is None:
            self.shard.host_kv.apply(plan)
        else:
            self.drain()
            self.pool.run(self.shard, KV_COPY, plan.pack())

    def _command(self, command: int, payload: torch.Tensor) -> object:
        """Run a command on every rank (rank 0's shard alone without workers)."""
        if self.pool is None:
            return self.shard.handle(command, payload)
        self.drain()
        return self.pool.run(self.shard, command, payload)

    def open_disk(self, namespace: bytes) -> None:
        """Every rank opens its part of ``kv_cache_dir`` under ``namespace`` (disk_tier.py)."""
        self._command(DISK_INIT, torch.tensor(digest_words(namespace), dtype=torch.int64))

    def load_from_disk(self, entries: list[tuple[bytes, int]]) -> int:
        """Every rank reads ``(digest, host block)`` pairs into its host store; the leading run all read."""
        rows = [[*digest_words(digest), host] for digest, host in entries]
        loaded = self._command(DISK_LOAD, torch.tensor(rows, dtype=torch.int64).view(-1))
        assert isinstance(loaded, int)
        return loaded

    def flush_disk(self) -> None:
        self._command(DISK_FLUSH, torch.empty(0, dtype=torch.int64))

    @torch.inference_mode()
    def execute(self, scheduled: SchedulerOutput, masks: TokenMasks | None = None) -> ModelOutput:
        """Run the step's forward pass, sample the rows that reached their last token and sum the
        requested prompt log-probs. A request whose sampling fails is reported in ``errors``.

        ``masks`` hands over the structured-output bitmask for the sampled rows; it is taken only after
        the forward pass was issued, so filling it overlaps the model."""
        self.drain()
        begin = time.perf_counter()
        step, rows = self._inputs(scheduled)
        use_graph = self.shard.can_replay(step)
        self.last_prepare_s = time.perf_counter() - begin
        if self.pool is None:
            logits = self.shard.run_step(step, rows, use_graph)
        else:
            logits = self.pool.run(self.shard, STEP, pack(self._batch(step, rows, use_graph)))  # type: ignore[assignment]
        return self._sample(step, logits, masks)

    @property
    def keeps_steps_in_flight(self) -> bool:
        """Whether ``launch`` returns before the step's logits exist (pipeline virtual engines)."""
        return self.in_flight is not None

    @torch.inference_mode()
    def launch(self, scheduled: SchedulerOutput) -> LaunchedStep:
        """Start the step and return without its logits: the later stages work on it while rank 0 goes
        on with another lane's step (pipeline_inflight.py). ``finish`` samples it."""
        if self.in_flight is None:
            raise RuntimeError("launch needs pipeline parallelism with steps in flight")
        begin = time.perf_counter()
        step, rows = self._inputs(scheduled)
        self.last_prepare_s = time.perf_counter() - begin
        work = self.in_flight.launch(STEP, pack(self._batch(step, rows, False)), step, rows)
        return LaunchedStep(step, work)

    @torch.inference_mode()
    def finish(self, launched: LaunchedStep, masks: TokenMasks | None = None) -> ModelOutput:
        """Wait for a launched step's logits, then sample and score as ``execute`` does."""
        assert self.in_flight is not None
        return self._sample(launched.step, self.in_flight.collect(launched.work), masks)

    def drain(self) -> None:
        """Receive the logits of every step in flight (kept for ``finish``) before another command."""
        if self.in_flight is not None:
            self.in_flight.drain()

    def _inputs(self, scheduled: SchedulerOutput) -> tuple[StepInputs, np.ndarray]:
        step = build_step_inputs(scheduled, self.cfg.block_size)
        step.block_tables = block_table_array(step.block_tables)
        return step, np.array(step.sample_rows + step.score_rows, dtype=np.int64)

    @staticmethod
    def _batch(step: StepInputs, rows: np.ndarray, use_graph: bool) -> StepBatch:
        return StepBatch(
            step.token_ids,
            step.positions,
            step.slot_mapping,
            step.query_start_loc,
            step.seq_lens,
            step.block_tables,  # type: ignore[arg-type]
            rows,
            use_graph,
        )

    def _sample(self, step: StepInputs, logits: torch.Tensor | None, masks: TokenMasks | None) -> ModelOutput:
        out = ModelOutput()
        if logits is None:
            return out
        dev = logits.device
        n_sample = len(step.sample_rows)
        if n_sample and step.speculative:
            sample_verified(
                logits[:n_sample],
                step.sample_requests,
                step.sampled_requests,
                self.eos_ids,
                masks,
                self.model_cfg.vocab_size,
                out,
                self.cfg.logprobs_mode,
            )
        elif n_sample:
            bitmask = masks.take_bitmask(step.sample_requests) if masks is not None else None
            sampled = sample_batch(
                logits[:n_sample], step.sample_requests, self.eos_ids, bitmask, self.cfg.logprobs_mode
            )
            out.sampled, out.logprobs, out.errors = sampled.tokens, sampled.logprobs, sampled.errors
        if step.score_rows:
            lp = torch.log_softmax(logits[n_sample:], dim=-1)
            picked = lp.gather(1, torch.tensor(step.score_targets, device=dev)[:, None])[:, 0].tolist()
            for owner, value in zip(step.score_owner, picked):
                out.prompt_logprobs[owner] = out.prompt_logprobs.get(owner, 0.0) + value
            if any(k >= 0 for k in step.score_topk):
                prompt_records(lp, step, out)
        return out

    def collective_stats(self) -> torch.Tensor | None:
        """Per rank ``[all_reduce_s, all_reduce_calls, gather_s, broadcast_s]`` since the start (None
        without tensor parallelism). A collective call, so only between steps."""
        if self.pool is None:
            return None
        self.drain()
        return self.pool.run(self.shard, COLLECTIVE_STATS, torch.empty(0, dtype=torch.int64))  # type: ignore[return-value]

    def pipeline_stats(self) -> torch.Tensor | None:
        """Per rank ``[compute_s, wait_s, bytes_sent, steps]`` since the start (None without PP)."""
        if self.pool is None or self.cfg.pipeline_parallel_size == 1:
            return None
        self.drain()
        return self.pool.run(self.shard, PIPELINE_STATS, torch.empty(0, dtype=torch.int64))  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the tensor-parallel workers, after every rank's pending block files are written. Idempotent."""
        if self.in_flight is not None and self.pool is not None and self.pool.failure is None:
            try:
                self.drain()  # steps still in flight (their requests were aborted): let them land
            except TensorParallelError:
                pass  # the pool is already stopped
        if self.shard.host_kv.disk is not None:
            try:
                if self.pool is not None and self.pool.failure is None:
                    self.flush_disk()  # the workers' writers (rank 0's own is closed below)
            finally:
                self.shard.close_disk()
        if self.pool is not None:
            self.pool.close()


def prompt_records(lp: torch.Tensor, step: StepInputs, out: ModelOutput) -> None:
    """``SamplingParams.prompt_logprobs``: per scored prompt position, the prompt token's record
    (always the model's raw distribution, as vLLM's)."""
    rows = [i for i, k in enumerate(step.score_topk) if k >= 0]
    records = logprob_records(
        lp[rows], [step.score_targets[i] for i in rows], [step.score_topk[i] for i in rows]
    )
    for i, record in zip(rows, records):
        out.prompt_positions.setdefault(step.score_owner[i], []).append((step.score_positions[i], record))


def rank_devices(name: str, world: int) -> list[torch.device]:
    """The device of each rank: the CPU for all, or consecutive CUDA devices from the current one
    (a flow lane pins itself to the first GPU of its group, so its group's GPUs are these)."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but no CUDA device is visible; use device='cpu'")
    if name == "cpu" or not torch.cuda.is_available():
        return [torch.device("cpu")] * world
    first, count = torch.cuda.current_device(), torch.cuda.device_count()
    if first + world > count:
        raise ValueError(
            f"tensor_parallel_size={world} needs {world} GPUs from cuda:{first}, but only {count} are visible "
            "(CUDA_VISIBLE_DEVICES); lower tensor_parallel_size or make more GPUs visible"
        )
    return [torch.device("cuda", first + r) for r in range(world)]

"""One rank's model: its slice of the weights, its KV cache, its decode graphs. What every rank runs.

Without tensor parallelism there is one shard, holding everything. With ``tensor_parallel_size=N``
the engine process holds rank 0's shard and each worker process one more; rank 0 broadcasts each
command (``INIT_CACHE`` once, then a ``STEP`` per engine step as a flat int64 payload) and every
shard runs the same code on it. A shard's KV cache holds only its own KV heads; block tables and
slots are the same on every rank, since they come from rank 0's one scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prefixflow import kernels
from prefixflow.engine.config import EngineConfig
from prefixflow.engine.cpu_allocator import tune_cpu_allocator
from prefixflow.engine.distributed.context import TensorParallel, for_group
from prefixflow.engine.distributed.group import DistributedGroup, ParallelGroup
from prefixflow.engine.distributed.pipeline import PipelineStage, stage_of
from prefixflow.engine.distributed.pipeline_step import PipelineStats, run_pipeline_step, wait_sends
from prefixflow.engine.distributed.step_payload import StepBatch, unpack
from prefixflow.engine.dtypes import torch_dtype
from prefixflow.engine.kv_offload.copy_plan import CopyPlan
from prefixflow.engine.kv_offload.disk_store import DiskKVStore
from prefixflow.engine.kv_offload.disk_tier import digest_of, staging_blocks
from prefixflow.engine.kv_offload.host_store import HostKVStore
from prefixflow.engine.loading.model_config import ModelConfig
from prefixflow.engine.loading.model_identity import ModelLocation, resolve_dtype
from prefixflow.engine.loading.model_source import ModelSource
from prefixflow.engine.models.llama import KVCache, LlamaForCausalLM, StepContext
from prefixflow.engine.models.weights import load_weights
from prefixflow.engine.quantization import KernelContext, resolve_quantization
from prefixflow.engine.quantization.int8_path import choose_cpu_int8
from prefixflow.engine.quantization.report import weight_bytes
from prefixflow.engine.quantization.weight_path import apply_weight_path, packed_head, weight_path_for
from prefixflow.engine.runner.attention import make_attention_backend
from prefixflow.engine.runner.decode_graphs import DecodeGraphs
from prefixflow.engine.runner.step_inputs import StepInputs

CPU_DEFAULT_KV_BYTES = 512 * 1024**2
INIT_CACHE = 1  # size the KV pool (the smallest over the ranks), allocate it, capture graphs
STEP = 2  # payload: step_payload.pack(StepBatch); rank 0 gets the gathered logits
PIPELINE_STATS = 4  # rank 0 gets [world, 4]: every rank's compute s, wait s, bytes sent, steps (PP only)
COLLECTIVE_STATS = (
    3  # rank 0 gets [world, 4]: every rank's all-reduce s, all-reduce calls, gather s, broadcast s
)
KV_COPY = 5  # payload: CopyPlan.pack(); offload / copy / reload blocks before the step that needs them
DISK_INIT = 6  # payload: the disk tier's 16-byte namespace as 2 int64s; every rank opens its store
DISK_LOAD = 7  # payload: [hi, lo, host block] per block; rank 0 gets how many every rank read and checked
DISK_FLUSH = 8  # wait until every rank's pending block files are written


class ModelShard:
    def __init__(
        self,
        source: ModelSource,
        model_cfg: ModelConfig,
        cfg: EngineConfig,
        max_model_len: int,
        tp: TensorParallel,
        device: torch.device,
        pp: PipelineStage | None = None,
    ) -> None:
        """``pp``: this rank's pipeline stage (its layers, its KV share), None without PP."""
        self.cfg, self.model_cfg, self.tp, self.pp = cfg, model_cfg, tp, pp
        self.pipeline_stats = PipelineStats()
        self.pipeline_pending: list[tuple[Any, torch.Tensor]] = []  # posted sends not yet waited for
        self.max_model_len = max_model_len
        self.device = device
        if device.type == "cpu":
            tune_cpu_allocator()  # once per process (engine/cpu_allocator.py)
        self.dtype = torch_dtype(resolve_dtype(cfg.dtype, device.type, source.location))
        if cfg.batch_invariant and device.type != "cpu":
            raise ValueError(
                f"EngineConfig.batch_invariant=True needs a CPU device (this engine runs on {device}); "
                "GPU kernels are not batch-invariant"
            )
        base_ops = kernels.select(cfg.kernel_backend, device)
        self.ops = kernels.batch_invariant(base_ops) if cfg.batch_invariant else base_ops
        self.attention = make_attention_backend(self.ops)
        quant = resolve_quantization(source.hf_config, cfg.quantization, cfg.sparsity)
        gguf_file = (
            source.location.path if source.location is not None and source.location.kind == "gguf" else None
        )
        dtype_name = str(self.dtype).removeprefix("torch.")
        self.weight_path = weight_path_for(
            quant, cfg.quantization, device.type, dtype_name, gguf_file, cfg.cpu_int8
        )
        self.quantization = apply_weight_path(quant, self.weight_path)
        with torch.device(device):
            self.model = LlamaForCausalLM(
                model_cfg, self.dtype, self.ops, self.attention, tp, self.quantization, pp
            )
        self.int8 = choose_cpu_int8(
            cfg.cpu_int8,
            device.type,
            dtype_name,
            self.weight_path.describe() if self.weight_path is not None else None,
            self.quantization.method,
        )
        load_weights(
            self.model, source.weights(), KernelContext(device, self.dtype, base_ops.name, self.int8.int8)
        )
        if self.int8.lm_head:
            self.model.use_int8_head()
        elif packed_head(self.weight_path, dtype_name, cfg.batch_invariant):
            self.model.use_packed_head()
        if cfg.batch_invariant:
            self.model.make_batch_invariant()
        self.weight_bytes = weight_bytes(self.model)
        self.model.eval()
        self.cos_sin_cache = kernels.build_rope_cache(
            model_cfg.head_dim,
            model_cfg.max_position_embeddings,
            model_cfg.rope_theta,
            model_cfg.rope_scaling,
        ).to(device)
        self.num_kv_heads = tp.layout.attention.num_kv_heads
        self.num_blocks = 0
        self.kv_caches: list[KVCache] = []
        self.graphs: DecodeGraphs | None = None

    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block on this rank (its own KV heads only)."""
        mc = self.model_cfg
        per_token = 2 * self.num_layers * self.num_kv_heads * mc.head_dim
        return per_token * self.cfg.block_size * _dtype_size(self.dtype)

    @property
    def num_layers(self) -> int:
        """Layers (and KV caches) on this rank: its pipeline stage's, or all."""
        return self.pp.num_layers if self.pp is not None else self.model_cfg.num_layers

    def handle(self, command: int, payload: torch.Tensor) -> object:
        """A command from rank 0 (workers), or rank 0's own part of it."""
        if self.pp is not None and command != STEP:
            wait_sends(self)  # a step's last sends land before anything else uses the groups
        if command == INIT_CACHE:
            return self.init_cache()
        if command == STEP:
            batch = unpack(payload)
            if self.pp is not None:
                return run_pipeline_step(self, batch_inputs(batch), batch.logit_rows)
            return self.run_step(batch_inputs(batch), batch.logit_rows, batch.decode_only)
        if command == COLLECTIVE_STATS:
            return self.collective_stats()
        if command == PIPELINE_STATS:
            return self.gathered_pipeline_stats()
        if command == KV_COPY:
            self.host_kv.apply(CopyPlan.unpack(payload))
            return None
        if command == DISK_INIT:
            self.open_disk(digest_of(*payload.tolist()))
            return None
        if command == DISK_LOAD:
            return self.load_from_disk(payload)
        if command == DISK_FLUSH:
            if self.host_kv.disk is not None:
                self.host_kv.disk.flush()
            return None
        raise ValueError(f"unknown command {command}")

    @torch.inference_mode()
    def init_cache(self) -> int:
        """Allocate the KV pool: every rank takes the smallest block count any rank can hold, so the
        one scheduler's block ids are valid everywhere."""
        self.num_blocks = self.all_ranks.all_reduce_min(self._local_num_blocks())
        mc, cfg = self.model_cfg, self.cfg
        shape = (self.num_layers, 2, self.num_blocks, cfg.block_size, self.num_kv_heads, mc.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.kv_caches = [(self.kv_cache[i, 0], self.kv_cache[i, 1]) for i in range(self.num_layers)]
        self.host_kv = HostKVStore(self.kv_cache, self._host_blocks())
        if self.device.type == "cuda" and not cfg.enforce_eager and self.pp is None:  # PP runs eager
            max_len = min(self.max_model_len, self.num_blocks * cfg.block_size)
            self.graphs = self.make_decode_graphs(-(-max_len // cfg.block_size), capture=True)
        return self.num_blocks

    def open_disk(self, namespace: bytes) -> None:
        """This rank's store in ``kv_cache_dir`` (files named by its global rank)."""
        assert self.cfg.kv_cache_dir is not None
        self.host_kv.disk = DiskKVStore(
            Path(self.cfg.kv_cache_dir),
            namespace,
            self.all_ranks.rank,
            self.cfg.kv_cache_dir_bytes,
            self.block_bytes,
        )

    def load_from_disk(self, payload: torch.Tensor) -> int:
        """Read the blocks into the host store; every rank agrees on the leading run all of them read."""
        disk = self.host_kv.disk
        assert disk is not None
        rows = payload.view(-1, 3).tolist()
        self.host_kv.quiesce()
        loaded = disk.load([(digest_of(hi, lo), host) for hi, lo, host in rows], self.host_kv.host)
        return self.all_ranks.all_reduce_min(loaded)

    def close_disk(self) -> None:
        disk, self.host_kv.disk = self.host_kv.disk, None
        if disk is not None:
            disk.close()

    def collective_stats(self) -> torch.Tensor | None:
        """Every rank's time inside collectives, gathered on rank 0 as rows ``[all_reduce_s,
        all_reduce_calls, gather_s, broadcast_s]`` (the fastest rank's all-reduce time is the
        communication itself; the others' also holds waiting for a slower rank)."""
        st = self.tp.group.stats
        mine = torch.tensor(
            [[st.all_reduce_s], [st.all_reduce_calls], [st.gather_s], [st.broadcast_s]],
            dtype=torch.float64,
            device=self.device,
        )
        rows = self.tp.group.gather_last_dim(mine)
        return None if rows is None else rows.T.cpu()

    def gathered_pipeline_stats(self) -> torch.Tensor | None:
        """Every rank's ``[compute_s, wait_s, bytes_sent, steps]`` under PP, gathered on rank 0."""
        st = self.pipeline_stats
        mine = torch.tensor(
            [[st.compute_s], [st.wait_s], [float(st.bytes_sent)], [float(st.steps)]],
            dtype=torch.float64,
            device=self.device,
        )
        rows = self.all_ranks.gather_last_dim(mine)
        return None if rows is None else rows.T.cpu()

    def make_decode_graphs(self, max_blocks_per_seq: int, capture: bool) -> DecodeGraphs:
        return DecodeGraphs(
            self.model,
            self.attention,
            self.kv_caches,
            self.cos_sin_cache,
            self.cfg.max_num_seqs,
            max_blocks_per_seq,
            capture,
        )

    def can_replay(self, step: StepInputs) -> bool:
        """Whether a decode graph serves this step (rank 0 decides; the workers follow its flag)."""
        graphs = self.graphs
        return graphs is not None and step.decode_only and graphs.bucket_for(len(step.seq_lens)) is not None

    @torch.inference_mode()
    def run_step(self, step: StepInputs, logit_rows: np.ndarray, use_graph: bool) -> torch.Tensor | None:
        """Forward the step, then the logits of ``logit_rows`` (float32, on rank 0; None elsewhere)."""
        if use_graph and self.graphs is not None:
            hidden = self.graphs.run(step)
        else:
            hidden = self.forward(step, self.kv_caches)
        rows = torch.from_numpy(np.asarray(logit_rows, dtype=np.int64)).to(self.device)
        logits = self.model.compute_logits(hidden[rows]) if rows.numel() else None
        if self.tp.world > 1 and self.device.type == "cuda":
            # NCCL runs asynchronously: wait here, inside the pool's guard, so a failed or aborted
            # collective surfaces as this step's TensorParallelError rather than later in sampling
            torch.cuda.current_stream(self.device).synchronize()
        return logits

    def forward(self, step: StepInputs, kv_caches: list[KVCache]) -> torch.Tensor:
        dev = self.device
        meta = self.attention.build_metadata(step, dev)
        ctx = StepContext(torch.from_numpy(step.positions).to(dev), meta, self.cos_sin_cache)
        ids = torch.from_numpy(step.token_ids).to(dev)
        if self.pp is not None and not self.pp.is_first:  # a later stage: stand-in activations
            x = torch.zeros((len(ids), self.model_cfg.hidden_size), dtype=self.dtype, device=dev)
            return self.model.forward_stage(x, torch.zeros_like(x), ctx, kv_caches)[0]
        if self.pp is not None:
            return self.model.forward_stage(ids, None, ctx, kv_caches)[0]
        hidden: torch.Tensor = self.model(ids, ctx, kv_caches)
        return hidden

    def _host_blocks(self) -> int:
        """Host-tier blocks: ``kv_offload_bytes`` covers every rank's share of a block (each rank keeps
        its own KV heads), and all ranks take the smallest count so host block ids agree."""
        cfg = self.cfg
        ranks = self.tp.world * (self.pp.num_stages if self.pp is not None else 1)
        if cfg.kv_offload_bytes == 0:
            if cfg.kv_cache_dir is None or not cfg.enable_prefix_caching:
                return 0
            return self.all_ranks.all_reduce_min(staging_blocks(self.num_blocks, self.block_bytes, ranks))
        return self.all_ranks.all_reduce_min(cfg.kv_offload_bytes // (self.block_bytes * ranks))

    @property
    def all_ranks(self) -> ParallelGroup:
        """The group of every rank of this engine: the world under pipeline parallelism, else the TP group."""
        return self.pp.world if self.pp is not None and self.pp.world is not None else self.tp.group

    def _local_num_blocks(self) -> int:
        if self.cfg.num_kv_blocks is not None:
            return self.cfg.num_kv_blocks
        budget = self.cfg.kv_cache_memory_bytes
        if budget is None and self.device.type == "cuda":
            budget = self._profile_free_memory()
        elif budget is None:
            budget = CPU_DEFAULT_KV_BYTES
        blocks = budget // self.block_bytes
        if blocks < 2:
            raise ValueError(
                f"KV cache budget of {budget} bytes holds fewer than 2 blocks of {self.block_bytes} bytes; "
                "raise gpu_memory_utilization / kv_cache_memory_bytes or lower max_num_batched_tokens"
            )
        return int(blocks)

    @torch.inference_mode()
    def _profile_free_memory(self) -> int:
        """Run the largest step once on a scratch cache, then give the KV pool what the
        ``gpu_memory_utilization`` share leaves after weights and that step's peak activations.
        Every rank runs it together (the forward pass has collectives)."""
        cfg, mc = self.cfg, self.model_cfg
        tokens = cfg.max_num_batched_tokens
        scratch_blocks = -(-tokens // cfg.block_size)
        scratch = torch.zeros(
            (self.num_layers, 2, scratch_blocks, cfg.block_size, self.num_kv_heads, mc.head_dim),
            dtype=self.dtype,
            device=self.device,
        )
        caches = [(scratch[i, 0], scratch[i, 1]) for i in range(self.num_layers)]
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(self.device)
        step = StepInputs(  # one request of the largest step size over the scratch cache
            token_ids=np.zeros(tokens, dtype=np.int64),
            positions=np.arange(tokens, dtype=np.int64) % mc.max_position_embeddings,
            slot_mapping=np.arange(tokens, dtype=np.int64),
            query_start_loc=np.array([0, tokens], dtype=np.int32),
            seq_lens=np.array([tokens], dtype=np.int32),
            block_tables=[list(range(scratch_blocks))],
        )
        hidden = self.forward(step, caches)  # under PP: this stage's layers alone, no activations sent
        rows = min(cfg.max_num_seqs, tokens)
        logits = self.model.compute_logits(hidden[:rows]) if self.pp is None or self.pp.is_last else None
        if logits is not None:
            logits.softmax(-1)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device)
        del scratch, caches, hidden, logits
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        in_use_by_others = total - free - torch.cuda.memory_allocated(self.device)
        budget = int(total * cfg.gpu_memory_utilization - in_use_by_others - peak)
        return max(budget, 0)


def batch_inputs(batch: StepBatch) -> StepInputs:
    """The ``StepInputs`` a worker rebuilds from a broadcast step (no request objects: none needed)."""
    return StepInputs(
        token_ids=batch.token_ids,
        positions=batch.positions,
        slot_mapping=batch.slot_mapping,
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        block_tables=batch.block_tables,
    )


@dataclass(frozen=True)
class WorkerShardFactory:
    """Builds a worker's shard in the worker process (picklable: only where the model is travels)."""

    location: ModelLocation
    cfg: EngineConfig
    max_model_len: int

    def __call__(self, group: ParallelGroup) -> ModelShard:
        from prefixflow.engine.loading.loader import load_location

        source = load_location(self.location)
        model_cfg = ModelConfig.from_hf(source.hf_config)
        tp, pp = shard_context(model_cfg, self.cfg, group)
        return ModelShard(source, model_cfg, self.cfg, self.max_model_len, tp, group.device, pp)


def shard_context(
    cfg: ModelConfig, engine: EngineConfig, group: ParallelGroup
) -> tuple[TensorParallel, PipelineStage | None]:
    """This rank's TP context and pipeline stage (None without PP); every rank calls it."""
    if engine.pipeline_parallel_size == 1:
        return for_group(cfg, group), None
    assert isinstance(group, DistributedGroup)
    stage_group, stage = stage_of(
        group, cfg, engine.pipeline_parallel_size, engine.tensor_parallel_size, engine.distributed_timeout_s
    )
    return for_group(cfg, stage_group), stage


def _dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()

"""Builds the model and its KV cache, and turns one scheduled step into one flat forward pass."""

from __future__ import annotations

import time

import numpy as np
import torch

from prefixflow import kernels
from prefixflow.engine.attention import make_attention_backend
from prefixflow.engine.config import EngineConfig
from prefixflow.engine.decode_graphs import DecodeGraphs
from prefixflow.engine.model_config import ModelConfig
from prefixflow.engine.model_source import ModelSource
from prefixflow.engine.models.llama import KVCache, LlamaForCausalLM, StepContext
from prefixflow.engine.models.weights import load_weights
from prefixflow.engine.quantization import KernelContext, resolve_quantization
from prefixflow.engine.quantization.report import weight_bytes
from prefixflow.engine.sampler import sample_batch
from prefixflow.engine.step_inputs import StepInputs, build_step_inputs
from prefixflow.engine.step_types import ModelOutput, SchedulerOutput, TokenMasks

CPU_DEFAULT_KV_BYTES = 512 * 1024**2


class ModelRunner:
    def __init__(
        self, source: ModelSource, model_cfg: ModelConfig, cfg: EngineConfig, max_model_len: int
    ) -> None:
        self.cfg = cfg
        self.model_cfg = model_cfg
        self.eos_ids = tuple(source.eos_token_ids)
        self.device = _pick_device(cfg.device)
        self.dtype = _pick_dtype(cfg.dtype, self.device)
        self.ops = kernels.select(cfg.kernel_backend, self.device)
        self.attention = make_attention_backend(self.ops)
        self.quantization = resolve_quantization(source.hf_config, cfg.quantization)
        with torch.device(self.device):
            self.model = LlamaForCausalLM(model_cfg, self.dtype, self.ops, self.attention, self.quantization)
        load_weights(self.model, source.weights(), KernelContext(self.device, self.dtype, self.ops.name))
        self.weight_bytes = weight_bytes(self.model)
        self.model.eval()
        self.cos_sin_cache = kernels.build_rope_cache(
            model_cfg.head_dim,
            model_cfg.max_position_embeddings,
            model_cfg.rope_theta,
            model_cfg.rope_scaling,
        ).to(self.device)
        self.num_blocks = self._num_kv_blocks()
        shape = (
            model_cfg.num_layers,
            2,
            self.num_blocks,
            cfg.block_size,
            model_cfg.num_kv_heads,
            model_cfg.head_dim,
        )
        self.kv_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.kv_caches: list[KVCache] = [(self.kv_cache[i, 0], self.kv_cache[i, 1]) for i in range(model_cfg.num_layers)]
        self.graphs: DecodeGraphs | None = None
        self.last_prepare_s = 0.0
        if self.device.type == "cuda" and not cfg.enforce_eager:
            max_len = min(max_model_len, self.num_blocks * cfg.block_size)
            self.graphs = self.make_decode_graphs(-(-max_len // cfg.block_size), capture=True)

    def make_decode_graphs(self, max_blocks_per_seq: int, capture: bool) -> DecodeGraphs:
        return DecodeGraphs(
            self.model, self.attention, self.kv_caches, self.cos_sin_cache, self.cfg.max_num_seqs,
            max_blocks_per_seq, capture,
        )  # fmt: skip

    @property
    def block_bytes(self) -> int:
        return self.model_cfg.kv_bytes_per_token * self.cfg.block_size * _dtype_size(self.dtype)

    def _num_kv_blocks(self) -> int:
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
        ``gpu_memory_utilization`` share leaves after weights and that step's peak activations."""
        cfg, mc = self.cfg, self.model_cfg
        tokens = cfg.max_num_batched_tokens
        scratch_blocks = -(-tokens // cfg.block_size)
        scratch = torch.zeros(
            (mc.num_layers, 2, scratch_blocks, cfg.block_size, mc.num_kv_heads, mc.head_dim),
            dtype=self.dtype,
            device=self.device,
        )
        caches = [(scratch[i, 0], scratch[i, 1]) for i in range(mc.num_layers)]
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
        hidden = self._run_model(step, caches)
        rows = min(cfg.max_num_seqs, tokens)
        self.model.compute_logits(hidden[:rows]).softmax(-1)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device)
        del scratch, caches, hidden
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        in_use_by_others = total - free - torch.cuda.memory_allocated(self.device)
        budget = int(total * cfg.gpu_memory_utilization - in_use_by_others - peak)
        return max(budget, 0)

    @torch.inference_mode()
    def execute(self, scheduled: SchedulerOutput, masks: TokenMasks | None = None) -> ModelOutput:
        """Run the step's forward pass, sample the rows that reached their last token and sum the
        requested prompt log-probs. A request whose sampling fails is reported in ``errors``.

        ``masks`` hands over the structured-output bitmask for the sampled rows; it is taken only after
        the forward pass was issued, so filling it overlaps the model."""
        begin = time.perf_counter()
        step = build_step_inputs(scheduled, self.cfg.block_size)
        self.last_prepare_s = time.perf_counter() - begin
        hidden = self._forward(step)
        dev = self.device
        out = ModelOutput()
        if step.sample_rows:
            logits = self.model.compute_logits(hidden[torch.tensor(step.sample_rows, device=dev)])
            bitmask = masks.take_bitmask(step.sample_requests) if masks is not None else None
            sampled = sample_batch(logits, step.sample_requests, self.eos_ids, bitmask)
            out.sampled, out.logprobs, out.errors = sampled.tokens, sampled.logprobs, sampled.errors
        if step.score_rows:
            score_logits = self.model.compute_logits(hidden[torch.tensor(step.score_rows, device=dev)])
            lp = torch.log_softmax(score_logits, dim=-1)
            picked = lp.gather(1, torch.tensor(step.score_targets, device=dev)[:, None])[:, 0].tolist()
            for owner, value in zip(step.score_owner, picked):
                out.prompt_logprobs[owner] = out.prompt_logprobs.get(owner, 0.0) + value
        return out

    def _forward(self, step: StepInputs) -> torch.Tensor:
        graphs = self.graphs
        if graphs is not None and step.decode_only and graphs.bucket_for(len(step.seq_lens)) is not None:
            return graphs.run(step)
        return self._run_model(step, self.kv_caches)

    def _run_model(self, step: StepInputs, kv_caches: list[KVCache]) -> torch.Tensor:
        dev = self.device
        meta = self.attention.build_metadata(step, dev)
        ctx = StepContext(torch.from_numpy(step.positions).to(dev), meta, self.cos_sin_cache)
        hidden: torch.Tensor = self.model(torch.from_numpy(step.token_ids).to(dev), ctx, kv_caches)
        return hidden


def _pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but no CUDA device is visible; use device='cpu'")
    return torch.device(name)


def _pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()

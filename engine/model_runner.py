"""Builds the model and its KV cache, and turns one scheduled step into one flat forward pass."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import AttentionBackend, AttentionMetadata
from engine.config import EngineConfig
from engine.model_config import ModelConfig
from engine.model_source import ModelSource
from engine.models.llama import LlamaForCausalLM, StepContext
from engine.models.norm import RMSNorm
from engine.models.weights import load_weights
from engine.request import Request

CPU_DEFAULT_KV_BYTES = 512 * 1024**2


@dataclass(frozen=True)
class StepResult:
    """Logits for the requests that sample this step, and log-prob sums for scoring requests."""

    sample_requests: list[Request]
    logits: torch.Tensor | None  # [len(sample_requests), vocab] float32
    scores: dict[int, float]  # request index -> log-prob added this step


class ModelRunner:
    def __init__(self, source: ModelSource, model_cfg: ModelConfig, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.model_cfg = model_cfg
        self.device = _pick_device(cfg.device)
        self.dtype = _pick_dtype(cfg.dtype, self.device)
        backend = cfg.attention_backend
        if backend == "auto":
            backend = "triton" if self.device.type == "cuda" else "torch"
        self.attention = AttentionBackend(backend, self.device)
        with torch.device(self.device):
            self.model = LlamaForCausalLM(model_cfg, self.dtype)
        load_weights(self.model, source.weights())
        self.model.eval()
        for module in self.model.modules():
            if isinstance(module, RMSNorm):
                module.ops = self.attention.ops
        import kernels

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
        self.kv_caches = [(self.kv_cache[i, 0], self.kv_cache[i, 1]) for i in range(model_cfg.num_layers)]

    def _num_kv_blocks(self) -> int:
        if self.cfg.num_kv_blocks is not None:
            return self.cfg.num_kv_blocks
        per_block = self.model_cfg.kv_bytes_per_token * self.cfg.block_size * _dtype_size(self.dtype)
        budget = self.cfg.kv_cache_memory_bytes
        if budget is None and self.device.type == "cuda":
            torch.cuda.synchronize()
            free, total = torch.cuda.mem_get_info(self.device)
            reserve = total * (1.0 - self.cfg.gpu_memory_utilization) + 2 * 1024**3  # activations
            budget = int(max(free - reserve, per_block * 2))
        elif budget is None:
            budget = CPU_DEFAULT_KV_BYTES
        blocks = budget // per_block
        if blocks < 2:
            raise ValueError(f"KV cache budget {budget} bytes holds fewer than 2 blocks of {per_block} bytes")
        return int(blocks)

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Request, int]]) -> StepResult:
        ids, positions, slots, starts, seq_lens, tables = [], [], [], [0], [], []
        bs = self.cfg.block_size
        sample_rows: list[int] = []
        sample_requests: list[Request] = []
        score_rows: list[int] = []
        score_targets: list[int] = []
        score_owner: list[int] = []
        for req, n in scheduled:
            begin, end = req.num_computed_tokens, req.num_computed_tokens + n
            base = starts[-1]
            ids.extend(req.token_ids[begin:end])
            positions.extend(range(begin, end))
            table = req.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(begin, end))
            starts.append(base + n)
            seq_lens.append(end)
            tables.append(table)
            if req.score_start is not None:
                lo = max(begin, req.score_start - 1)
                for p in range(lo, min(end, req.num_tokens - 1)):
                    score_rows.append(base + p - begin)
                    score_targets.append(req.token_ids[p + 1])
                    score_owner.append(req.index)
            elif end == req.num_tokens:
                sample_rows.append(base + n - 1)
                sample_requests.append(req)
        meta = self._metadata(slots, starts, seq_lens, tables)
        dev = self.device
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        ctx = StepContext(pos, meta, self.attention, self.cos_sin_cache)
        hidden = self.model(torch.tensor(ids, dtype=torch.long, device=dev), ctx, self.kv_caches)
        logits = None
        if sample_rows:
            logits = self.model.compute_logits(hidden[torch.tensor(sample_rows, device=dev)])
        scores: dict[int, float] = {}
        if score_rows:
            score_logits = self.model.compute_logits(hidden[torch.tensor(score_rows, device=dev)])
            lp = torch.log_softmax(score_logits, dim=-1)
            picked = lp.gather(1, torch.tensor(score_targets, device=dev)[:, None])[:, 0].tolist()
            for owner, value in zip(score_owner, picked):
                scores[owner] = scores.get(owner, 0.0) + value
        return StepResult(sample_requests, logits, scores)

    def _metadata(self, slots, starts, seq_lens, tables) -> AttentionMetadata:
        dev = self.device
        width = max(len(t) for t in tables)
        table_tensor = torch.zeros((len(tables), width), dtype=torch.int32)
        for i, t in enumerate(tables):
            table_tensor[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        query_lens = [b - a for a, b in zip(starts, starts[1:])]
        return AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            block_tables=table_tensor.to(dev),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
        )


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

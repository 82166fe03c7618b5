"""One decoder implementation for the Llama family (Llama 2/3/3.1, Mistral, Qwen2, Qwen3).

Works on a flat batch of tokens from many requests: ``[T]`` ids and positions plus the step's
attention metadata. Kernels reach every layer one way: the ``KernelBackend`` and the
``AttentionBackend`` are constructor arguments (no defaults, no fallback), and ``StepContext``
carries only per-step data. The differences between families are flags on ``ModelConfig``: q/k/v bias
(Qwen2), per-head q/k RMSNorm (Qwen3), explicit ``head_dim``, tied embeddings, rope scaling.
Each linear layer gets its ``LinearMethod`` from the ``QuantizationConfig`` by its checkpoint module
names (``model.layers.0.self_attn.q_proj`` ...); the model never looks at the storage format.
"""

from __future__ import annotations

import torch
from torch import nn

from prefixflow.engine.distributed.context import TensorParallel, single_rank
from prefixflow.engine.distributed.pipeline import PipelineStage
from prefixflow.engine.distributed.sharding import Partition
from prefixflow.engine.loading.model_config import ModelConfig
from prefixflow.engine.models.linear import INVARIANT_MIN_ROWS, Linear, invariant_rows
from prefixflow.engine.models.norm import RMSNorm
from prefixflow.engine.models.parallel_linear import ColumnParallelLinear, RowParallelLinear
from prefixflow.engine.models.vocab_parallel import VocabParallelEmbedding, gather_logits
from prefixflow.engine.quantization import NO_QUANTIZATION, QuantizationConfig, dual_gguf
from prefixflow.engine.runner.attention import AttentionBackend
from prefixflow.kernels import KernelBackend, cpu_gguf_matvec
from prefixflow.kernels.cpu_int8 import Int8Weight, int8_linear, pack_int8
from prefixflow.kernels.cpu_linear import dense_linear

KVCache = tuple[torch.Tensor, torch.Tensor]


class StepContext:
    """What every layer needs for one step, passed explicitly (never global)."""

    def __init__(self, positions: torch.Tensor, attn_metadata: object, cos_sin_cache: torch.Tensor) -> None:
        self.positions = positions
        self.attn_metadata = attn_metadata  # opaque: made by, and handed back to, the attention backend
        self.cos_sin_cache = cos_sin_cache


class Attention(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        ops: KernelBackend,
        backend: AttentionBackend,
        tp: TensorParallel,
        quant: QuantizationConfig,
        prefix: str,
    ) -> None:
        super().__init__()
        self.ops, self.backend = ops, backend
        shard, d = tp.layout.attention, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = shard.num_heads, shard.num_kv_heads, d
        q = Partition(shard.q_heads.start * d, shard.q_heads.end * d, cfg.num_heads * d)
        kv = Partition(shard.kv_heads.start * d, shard.kv_heads.end * d, cfg.num_kv_heads * d)
        qkv = [f"{prefix}.{p}" for p in ("q_proj", "k_proj", "v_proj")]
        self.qkv_proj = ColumnParallelLinear(
            cfg.hidden_size,
            [q, kv, kv],
            bias=cfg.attention_bias,
            dtype=dtype,
            method=quant.linear_method(qkv),
            prefixes=qkv,
        )
        o_bias = cfg.attention_bias and cfg.family != "qwen2"
        o = [f"{prefix}.o_proj"]
        self.o_proj = RowParallelLinear(
            q, cfg.hidden_size, tp.group, bias=o_bias, dtype=dtype, method=quant.linear_method(o), prefixes=o
        )
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, dtype, ops) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, dtype, ops) if cfg.qk_norm else None
        self.scale = self.head_dim**-0.5

    def forward(
        self, x: torch.Tensor, ctx: StepContext, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.out_sizes, dim=-1)
        q = q.reshape(n, self.num_heads, self.head_dim)
        k = k.reshape(n, self.num_kv_heads, self.head_dim)
        v = v.reshape(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.reshape(-1, self.head_dim)).reshape(q.shape)
            k = self.k_norm(k.reshape(-1, self.head_dim)).reshape(k.shape)
        q, k = self.ops.rotary(q, k, ctx.positions, ctx.cos_sin_cache)
        out = self.backend.forward(q, k, v, k_cache, v_cache, ctx.attn_metadata, self.scale)
        projected: torch.Tensor = self.o_proj(out.reshape(n, self.num_heads * self.head_dim))
        return projected


class MLP(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        ops: KernelBackend,
        tp: TensorParallel,
        quant: QuantizationConfig,
        prefix: str,
    ) -> None:
        super().__init__()
        self.ops = ops
        inter = tp.layout.intermediate
        gate_up, down = [f"{prefix}.gate_proj", f"{prefix}.up_proj"], [f"{prefix}.down_proj"]
        self.gate_up_proj = ColumnParallelLinear(
            cfg.hidden_size,
            [inter, inter],
            dtype=dtype,
            method=quant.linear_method(gate_up),
            prefixes=gate_up,
        )
        self.down_proj = RowParallelLinear(
            inter, cfg.hidden_size, tp.group, dtype=dtype, method=quant.linear_method(down), prefixes=down
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))
        return out


class DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        ops: KernelBackend,
        backend: AttentionBackend,
        tp: TensorParallel,
        quant: QuantizationConfig = NO_QUANTIZATION,
        prefix: str = "model.layers.0",
    ) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, dtype, ops, backend, tp, quant, f"{prefix}.self_attn")
        self.mlp = MLP(cfg, dtype, ops, tp, quant, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, ops)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, ops)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        ctx: StepContext,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, ctx, k_cache, v_cache)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    """The decoder, or with ``tp`` one rank's slice of it: its heads, its intermediate columns, its
    vocabulary rows. Every rank returns the same hidden states; ``compute_logits`` returns the full
    logits on rank 0 only (None on the others).

    With ``pp`` (pipeline parallelism) only the stage's layers ``[first_layer, end_layer)`` exist; the
    embedding only on the first stage (and the last when the LM head is tied to it), the final norm
    and LM head only on the last; ``forward_stage`` runs the stage's part."""

    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        ops: KernelBackend,
        attention: AttentionBackend,
        tp: TensorParallel | None = None,
        quant: QuantizationConfig = NO_QUANTIZATION,
        pp: PipelineStage | None = None,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.tp = tp = tp or single_rank(cfg)
        self.pp = pp
        first, end = (pp.first_layer, pp.end_layer) if pp is not None else (0, cfg.num_layers)
        is_first, is_last = pp is None or pp.is_first, pp is None or pp.is_last
        self.first_layer = first
        self.embed_tokens = (
            VocabParallelEmbedding(tp.layout.vocab, cfg.hidden_size, tp.group, dtype)
            if is_first or (is_last and cfg.tie_word_embeddings)
            else None
        )
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, dtype, ops, attention, tp, quant, f"model.layers.{i}")
            for i in range(first, end)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, ops) if is_last else None
        self.lm_head = (
            None
            if cfg.tie_word_embeddings or not is_last
            else ColumnParallelLinear(
                cfg.hidden_size,
                [tp.layout.vocab.owned],
                dtype=dtype,
                method=quant.linear_method(["lm_head"]),
                prefixes=["lm_head"],
            )
        )

        self.min_rows = 0
        self.int8_head: Int8Weight | None = None  # the tied LM head in int8 (cpu_int8; use_int8_head)
        self.packed_head: torch.Tensor | None = None  # the tied LM head as Q8_0 blocks (use_packed_head)

    def use_int8_head(self) -> None:
        """The tied LM head multiplies an int8 copy of the embedding (the embedding itself stays as
        loaded for the lookup); an untied head is a ``Linear`` and follows its method."""
        if self.lm_head is None and self.embed_tokens is not None:
            self.int8_head = pack_int8(self.embed_tokens.weight)

    def use_packed_head(self) -> bool:
        """Decodes of few float32 rows multiply the tied LM head as the Q8_0 blocks its embedding was
        dequantized from (a quarter of the bytes, on the native matvec), where those blocks are
        recovered exactly (kernels/cpu_gguf_matvec.py ``q8_0_blocks``). Whether they were."""
        if self.lm_head is None and self.embed_tokens is not None and cpu_gguf_matvec.available():
            blocks = cpu_gguf_matvec.q8_0_blocks(self.embed_tokens.weight)
            if blocks is not None:
                self.packed_head = blocks
                self.register_buffer("packed_head_blocks", blocks, persistent=False)  # in weight_bytes
        return self.packed_head is not None

    def _packed_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """The tied head's Q8_0 blocks times a few rows (``use_packed_head``), or None: no blocks, more
        rows than the matvec takes, batch-invariant mode, or a call the kernel cannot take."""
        if self.packed_head is None or self.min_rows or hidden.shape[0] > dual_gguf.FLOAT32_PACKED_MAX_ROWS:
            return None
        return cpu_gguf_matvec.matvec("Q8_0", self.packed_head, hidden)

    def make_batch_invariant(self) -> None:
        """Every matmul of the model, the tied LM head included, runs on ``INVARIANT_MIN_ROWS`` to
        ``INVARIANT_MAX_ROWS`` rows at a time, so a row's bits never depend on how many other rows share the step."""
        self.min_rows = INVARIANT_MIN_ROWS
        for module in self.modules():
            if isinstance(module, Linear):
                module.min_rows = INVARIANT_MIN_ROWS

    def forward(self, input_ids: torch.Tensor, ctx: StepContext, kv_caches: list[KVCache]) -> torch.Tensor:
        hidden, _ = self.forward_stage(input_ids, None, ctx, kv_caches)
        return hidden

    def forward_stage(
        self, x: torch.Tensor, residual: torch.Tensor | None, ctx: StepContext, kv_caches: list[KVCache]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This stage's layers: from token ids (first stage) or the previous stage's (hidden, residual);
        returns the final hidden states (last stage: residual None) or the (hidden, residual) to send."""
        if self.pp is None or self.pp.is_first:
            assert self.embed_tokens is not None
            x, residual = self.embed_tokens(x), None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            x, residual = layer(x, residual, ctx, k_cache, v_cache)
        if self.norm is None:
            assert residual is not None
            return x, residual
        hidden: torch.Tensor
        hidden, _ = self.norm(x, residual)
        return hidden, None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """float32 ``[rows, vocab]`` on rank 0; every rank must call it (it gathers)."""
        if self.lm_head is None:
            assert self.embed_tokens is not None, "the LM head lives on the last pipeline stage"
            weight, int8_head = self.embed_tokens.weight, self.int8_head  # tied: the embedding is the head
            packed = self._packed_logits(hidden)
            if packed is not None:
                local = packed
            elif int8_head is not None:
                local = invariant_rows(lambda rows: int8_linear(rows, int8_head), hidden, self.min_rows)
            else:
                local = invariant_rows(lambda rows: dense_linear(rows, weight), hidden, self.min_rows)
        else:
            local = self.lm_head(hidden)
        return gather_logits(local, self.tp.layout.vocab, self.tp.group)

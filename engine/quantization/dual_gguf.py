"""A GGUF block layer kept both ways on the CPU: packed for products of few rows, dense for the rest.

Why: on a CPU with native bf16 matmuls the dense bf16 matmul beats torch's int4 pack op 1.8x from
batch 16 on, but a step of a few rows reads every weight for almost no arithmetic, and there the
packed blocks (a quarter of the bytes) won: batch 1 ran 1.15x faster packed than dense on the Zen 5
host (benchmarks/RESULTS.md issue 24, "Eleventh round"), because streaming 270 MB of dense weights per
token also evicts everything else a step touches from the caches. Holding both costs the packed bytes
again (a quarter of the dense ones); each product takes the path that is faster for its row count.
``PACKED_MAX_ROWS``: end to end (SmolLM2, 128-token prompts, 32 new tokens, process CPU-s, 1 thread),
batch 1-4 ran 1.16-1.33x faster with their decodes packed and batch 8 level (1.00-1.01x); in cache
a single layer's packed product was faster only up to 2-4 rows, but in a step the weights come from DRAM.

The dense copy is the checkpoint's dequantization rounded to the activation dtype, bit for bit what
``DenseMethod`` holds (so products of more than ``PACKED_MAX_ROWS`` rows give the dense path's bits);
the packed path is the same blocks through ``weight_only_kernel``. Batch-invariant mode pads every
product to at least 16 rows and takes the dense copy for every product, whatever its rows.

Float32 rows (every CPU without native bf16, and ``dtype="float32"``): torch's pack ops have no fast
float32 path (its int4 op ran 5.7x slower than the dense matmul on AVX2), so the layer keeps the
file's blocks as they lie and products of at most ``FLOAT32_PACKED_MAX_ROWS`` rows run through the
native matvec (kernels/cpu_gguf_matvec.py); a call it cannot take, or a longer product, runs dense.
Those results differ from the dense matmul's by float32 rounding only (the weights are the same
numbers). ``FLOAT32_PACKED_MAX_ROWS``: with 8 rows a pass over the blocks, end to end on an emulated
AVX2 host (SmolLM2, 128-token prompts, 32 new tokens), up to 64 rows against up to 16 ran 1.02-1.04x at
batch 32-64 on 1 thread and 1.06-1.20x on 2 (benchmarks/RESULTS.md issue 24, "Sixteenth round"); a
step's weights come from DRAM, and one pass over the blocks per 8 rows still reads less than the dense
matmul does at 64 rows.
"""

from __future__ import annotations

import torch
from torch import nn

from prefixflow.engine.quantization.gguf_blocks import GGUFMethod, packed_param
from prefixflow.engine.quantization.method import KernelContext
from prefixflow.engine.quantization.params import buffer
from prefixflow.kernels import cpu_gguf_matvec
from prefixflow.kernels.cpu_linear import (
    PREPACKED,
    PrepackedWeight,
    dense_linear,
    linear_kernel,
    prepack,
    prepacked_linear,
)
from prefixflow.kernels.quant_weight import dequantize

PACKED_MAX_ROWS = 4  # products of at most this many rows take the packed blocks (measured: below)
FLOAT32_PACKED_MAX_ROWS = 64  # the same for float32 rows on the native matvec (measured: module doc)


class DualGGUFMethod(GGUFMethod):
    """``GGUFMethod`` plus a dense copy for products of more than ``PACKED_MAX_ROWS`` rows (CPU only)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.name = f"gguf-{kind.lower()}+dense"
        self.dense: torch.Tensor | None = None
        self.prepacked: PrepackedWeight | None = None
        self.blocks: torch.Tensor | None = None  # float32 rows: the file's blocks, for the native matvec

    def process_after_loading(self, layer: nn.Module, ctx: KernelContext) -> None:
        self.check_complete()
        if ctx.device.type == "cpu":
            dense = dequantize(self.build(layer)).to(ctx.dtype)
            chosen = linear_kernel("cpu", str(ctx.dtype).removeprefix("torch."))
            if chosen is not None and chosen.kernel == PREPACKED:
                self.prepacked = prepack(dense)
            else:
                self.dense = dense
                layer.register_buffer("dense_weight", dense, persistent=False)  # counted in weight_bytes
            if ctx.dtype == torch.float32:
                self.blocks = buffer(layer, packed_param(self.kind)).contiguous()
                for name in self.specs:
                    delattr(layer, name)
                layer.register_buffer("gguf_blocks", self.blocks, persistent=False)
                return
        super().process_after_loading(layer, ctx)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.numel() // max(1, x.shape[-1])
        # float32: the native matvec for few rows, except in batch-invariant mode (min_rows), which pads
        # products to 16 rows and must take one kernel whatever the row count; bf16: the pack op for few rows
        if self.blocks is not None:
            if rows <= FLOAT32_PACKED_MAX_ROWS and not getattr(layer, "min_rows", 0):
                out = cpu_gguf_matvec.matvec(self.kind, self.blocks, x)
                if out is not None:
                    return out if bias is None else out + bias
        elif rows <= PACKED_MAX_ROWS:
            return super().apply(layer, x, bias)
        if self.prepacked is not None:
            return prepacked_linear(x, self.prepacked, bias)
        if self.dense is not None:
            return dense_linear(x, self.dense, bias)
        return super().apply(layer, x, bias)

    @property
    def kernel_name(self) -> str:
        return "native-matvec" if self.blocks is not None else super().kernel_name

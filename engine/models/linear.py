"""Linear layers whose weight storage and matmul are delegated to a ``LinearMethod``.

Why: quantized formats (GPTQ, AWQ, compressed-tensors, GGUF blocks, on-the-fly int8/int4/fp8) and,
later, tensor-parallel sharding change how weights are stored and multiplied, not the model's
structure. The model asks its ``QuantizationConfig`` for a method per layer and never looks at the
format. Merged projections (q|k|v, gate|up) load each checkpoint tensor into its slice by ``shard``;
``prefixes`` are the checkpoint module names of the shards (for the method's choice and for errors).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from prefixflow.engine.quantization.method import DenseMethod, KernelContext, LinearMethod
from prefixflow.engine.quantization.params import CheckpointError

__all__ = [
    "INVARIANT_MAX_ROWS",
    "INVARIANT_MIN_ROWS",
    "DenseMethod",
    "KernelContext",
    "Linear",
    "LinearMethod",
    "invariant_rows",
    "pad_rows",
]

# Batch-invariant mode (EngineConfig.batch_invariant): every matmul gets at least this many rows. On the
# CPU BLAS torch ships, ``x @ W.T`` gives a row the same bits whatever the other rows are once the
# product has 12 or more rows (fewer take a gemv-like path with another summation order; measured in
# benchmarks/RESULTS.md, issue 26); 16 leaves a margin. Zero rows cost little: small-M matmuls are
# bound by reading the weights, not by the rows.
INVARIANT_MIN_ROWS = 16
# ... and at most this many: a longer product runs in blocks of this many rows. oneDNN's bf16 matmul on AMX
# tiles (and MKL's float32 one at some shapes) changes a row's bits from 33 rows on: at 64 rows every SmolLM2
# layer differed in some rows, the 49,152-wide head in 60 of 64, while products of 16-32 rows always gave a
# row its 16-row bits (benchmarks/RESULTS.md issue 24, "Eighth round").
INVARIANT_MAX_ROWS = 32


def pad_rows(x: torch.Tensor, min_rows: int) -> torch.Tensor:
    """``x`` with zero rows appended up to ``min_rows`` (``x`` itself when it has enough)."""
    n = x.shape[0]
    if n >= min_rows:
        return x
    return torch.cat([x, x.new_zeros((min_rows - n, *x.shape[1:]))])


def invariant_rows(
    matmul: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, min_rows: int
) -> torch.Tensor:
    """``matmul(x)`` with each row's bits independent of the other rows: ``min_rows`` 0 is one call;
    otherwise as few blocks of at most ``INVARIANT_MAX_ROWS`` rows as cover ``x``, of equal size (any row
    count from ``min_rows`` to ``INVARIANT_MAX_ROWS`` gives a row the same bits), a short one padded to
    ``min_rows``. Why equal: 40 rows (a verification step of 8 requests x 5) as 20 + 20 multiply 40 rows,
    where 32 + 8 padded to 16 multiplied 48."""
    n = x.shape[0]
    if not min_rows or (min_rows <= n <= INVARIANT_MAX_ROWS):
        return matmul(x)
    if n < min_rows:
        return matmul(pad_rows(x, min_rows))[:n]
    blocks = -(-n // INVARIANT_MAX_ROWS)
    step = -(-n // blocks)
    return torch.cat(
        [matmul(pad_rows(x[s : s + step], min_rows))[: min(step, n - s)] for s in range(0, n, step)]
    )


class Linear(nn.Module):
    """``y = x W^T + b`` whose output rows are the concatenation of ``out_sizes`` shards."""

    def __init__(
        self,
        in_features: int,
        out_sizes: Sequence[int] | int,
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
        method: LinearMethod | None = None,
        prefixes: Sequence[str] = (),
        full_sizes: tuple[int, list[int]] | None = None,
    ) -> None:
        """``full_sizes``: (inputs, output shard sizes) of the whole layer when this is one rank's part."""
        super().__init__()
        self.out_sizes = [out_sizes] if isinstance(out_sizes, int) else list(out_sizes)
        self.in_features = in_features
        self.out_features = sum(self.out_sizes)
        self.prefixes = list(prefixes) or [f"shard {i}" for i in range(len(self.out_sizes))]
        self.method = method or DenseMethod()
        self.method.create_weights(self, in_features, self.out_sizes, dtype, self.prefixes, full_sizes)
        self.bias = (
            nn.Parameter(torch.empty(self.out_features, dtype=dtype), requires_grad=False) if bias else None
        )
        self._bias_shards: set[int] = set()
        self.min_rows = 0  # INVARIANT_MIN_ROWS in batch-invariant mode

    def load(self, param: str, tensor: torch.Tensor, shard: int = 0) -> None:
        """Copy one checkpoint tensor (``weight``, ``bias``, ``qweight``, ...) of output shard ``shard``."""
        if not 0 <= shard < len(self.out_sizes):
            raise CheckpointError(f"shard {shard} of a layer with {len(self.out_sizes)} shards")
        if param != "bias":
            self.method.load(self, param, tensor, shard)
            return
        if self.bias is None:
            raise CheckpointError(f"unexpected tensor {self.prefixes[shard]}.bias: this layer has no bias")
        if tuple(tensor.shape) != (self.out_sizes[shard],):
            raise CheckpointError(
                f"{self.prefixes[shard]}.bias has shape {tuple(tensor.shape)}, expected ({self.out_sizes[shard]},)"
            )
        offset = sum(self.out_sizes[:shard])
        self.bias.data[offset : offset + tensor.shape[0]].copy_(tensor)
        self._bias_shards.add(shard)

    def process_after_loading(self, ctx: KernelContext) -> None:
        """Check the layer is complete, then let the method repack for ``ctx``'s kernel."""
        if self.bias is not None and len(self._bias_shards) < len(self.out_sizes):
            gaps = [
                f"{self.prefixes[i]}.bias" for i in range(len(self.out_sizes)) if i not in self._bias_shards
            ]
            raise CheckpointError(f"checkpoint is missing {', '.join(gaps)}")
        self.method.process_after_loading(self, ctx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return invariant_rows(lambda rows: self.method.apply(self, rows, self.bias), x, self.min_rows)

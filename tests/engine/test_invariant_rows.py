"""Batch-invariant linear layers (engine/models/linear.py ``invariant_rows``): a row's output has the same
bits alone and inside products of any row count, on whichever CPU matmul the layer took (oneDNN-prepacked
bf16 changes a row's bits from 33 rows on where the CPU has AMX tiles; the row blocks make that harmless)."""

from __future__ import annotations

import pytest
import torch

from prefixflow.engine.models.linear import INVARIANT_MAX_ROWS, INVARIANT_MIN_ROWS, Linear, invariant_rows
from prefixflow.engine.quantization.method import KernelContext

ROW_COUNTS = [1, 5, 16, 31, 32, 33, 47, 64, 100, 257]


def _layer(out_features: int, in_features: int, dtype: torch.dtype) -> Linear:
    gen = torch.Generator().manual_seed(out_features)
    layer = Linear(in_features, [out_features], dtype=dtype)
    layer.load(
        "weight", (torch.randn(out_features, in_features, generator=gen) / in_features**0.5).to(dtype), 0
    )
    layer.process_after_loading(KernelContext(torch.device("cpu"), dtype))
    layer.min_rows = INVARIANT_MIN_ROWS
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3072, 576), (576, 1536), (4096, 256)], ids=["wide", "deep", "head"])
def test_a_row_gets_its_bits_whatever_the_row_count(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    layer = _layer(*shape, dtype)
    x = torch.randn(max(ROW_COUNTS), shape[1], generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.inference_mode():
        alone = torch.cat([layer(x[i : i + 1]) for i in range(x.shape[0])])
        for rows in ROW_COUNTS:
            assert torch.equal(layer(x[:rows]), alone[:rows]), f"{rows} rows changed some row's bits"


def test_row_blocks_cover_every_row_once_and_pad_short_blocks() -> None:
    seen: list[int] = []

    def matmul(rows: torch.Tensor) -> torch.Tensor:
        seen.append(rows.shape[0])
        return rows * 2

    x = torch.arange(2 * INVARIANT_MAX_ROWS + 3, dtype=torch.float32)[:, None]
    assert torch.equal(invariant_rows(matmul, x, INVARIANT_MIN_ROWS), x * 2)
    assert seen == [23, 23, 21]  # 67 rows in 3 equal blocks (not 32 + 32 + 3 padded to 16)
    seen.clear()
    assert torch.equal(invariant_rows(matmul, x[:40], INVARIANT_MIN_ROWS), x[:40] * 2) and seen == [20, 20]
    seen.clear()
    long = torch.arange(4 * INVARIANT_MAX_ROWS + 1, dtype=torch.float32)[:, None]
    assert torch.equal(invariant_rows(matmul, long, INVARIANT_MIN_ROWS), long * 2)
    assert seen == [26, 26, 26, 26, 25] and all(INVARIANT_MIN_ROWS <= r <= INVARIANT_MAX_ROWS for r in seen)
    seen.clear()
    assert torch.equal(invariant_rows(matmul, x, 0), x * 2) and seen == [x.shape[0]]  # the mode off: one call

"""Triton paged attention (varlen and split-KV paths) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from prefixflow.kernels import reference
from tests.kernels.kernel_testlib import DEVICE, PagedBatch, build_paged_batch, poisoned_like, relative_error

pytest.importorskip("triton")


def triton_attention():  # type: ignore[no-untyped-def]
    """The kernel module, imported inside a test (under the triton_interpreter fixture on CPU): imported at
    collection, its kernels would be decorated for compilation."""
    import prefixflow.kernels.triton_attention as module

    return module


MIXED = [(1, 37), (7, 30), (20, 20)]  # decode, prefill chunk over a cached prefix, fresh prefill
F32_BOUND = 2e-5
BF16_BOUND = 2e-2  # bf16 operands and bf16 probabilities in the PV product


def check(batch: PagedBatch, scale: float, bound: float = F32_BOUND, **kwargs: int) -> None:
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.query_start_loc, batch.seq_lens)
    ref = reference.paged_attention(*args, scale)
    out = poisoned_like(batch.q)
    returned = triton_attention().paged_attention(*args, scale, out=out, **kwargs)
    assert returned.data_ptr() == out.data_ptr()
    assert relative_error(out, ref) < bound


@pytest.mark.parametrize("heads", [(4, 2), (4, 1), (4, 4)], ids=["gqa", "mqa", "mha"])
@pytest.mark.parametrize("block_size", [16, 32])
def test_varlen_mixed_batch(heads: tuple[int, int], block_size: int) -> None:
    batch = build_paged_batch(MIXED, *heads, head_dim=32, block_size=block_size, seed=block_size)
    check(batch, 32**-0.5, num_kv_splits=1)


@pytest.mark.parametrize("head_dim", [16, 64])
def test_varlen_other_head_dims(head_dim: int) -> None:
    batch = build_paged_batch([(5, 50), (3, 3)], 8, 2, head_dim=head_dim, block_size=16, seed=head_dim)
    check(batch, head_dim**-0.5, num_kv_splits=1)


def test_varlen_long_prefill_spans_several_query_tiles() -> None:
    """More query tokens than one tile holds, plus a one-token request after it in the batch."""
    batch = build_paged_batch([(45, 70), (1, 1)], 2, 2, head_dim=32, block_size=16, seed=3)
    check(batch, 0.2, num_kv_splits=1)


@pytest.mark.parametrize("heads", [(4, 2), (4, 1), (4, 4)], ids=["gqa", "mqa", "mha"])
def test_decode_only_batch_default_path(heads: tuple[int, int]) -> None:
    batch = build_paged_batch([(1, 37), (1, 5), (1, 64)], *heads, head_dim=32, block_size=16, seed=7)
    check(batch, 32**-0.5)


@pytest.mark.parametrize("splits", [1, 3])
def test_block_tables_padded_with_minus_one(splits: int) -> None:
    batch = build_paged_batch([(1, 40), (1, 3), (1, 17)], 4, 2, head_dim=32, block_size=16, seed=21)
    for b, n in enumerate(batch.seq_lens.tolist()):
        batch.block_tables[b, -(-n // 16) :] = -1
    check(batch, 0.2, num_kv_splits=splits)


@pytest.mark.parametrize("splits", [2, 3, 4])
@pytest.mark.parametrize("block_size", [16, 32])
def test_split_kv_decode(splits: int, block_size: int) -> None:
    """Slices that are empty (context shorter than the split) must drop out of the lse merge."""
    batch = build_paged_batch(
        [(1, 100), (1, 5), (1, 33)], 4, 2, head_dim=32, block_size=block_size, seed=splits
    )
    check(batch, 32**-0.5, num_kv_splits=splits)


@pytest.mark.parametrize("splits", [1, 3])
def test_bf16_mixed_and_split(splits: int) -> None:
    shapes = MIXED if splits == 1 else [(1, 100), (1, 5), (1, 33)]
    batch = build_paged_batch(shapes, 4, 2, head_dim=32, block_size=16, dtype=torch.bfloat16, seed=splits)
    check(batch, 32**-0.5, BF16_BOUND, num_kv_splits=splits)


def test_split_kv_refuses_prefill_batch() -> None:
    batch = build_paged_batch(MIXED, 4, 2, head_dim=32, block_size=16)
    with pytest.raises(ValueError, match="decode-only"):
        check(batch, 0.1, num_kv_splits=2)


def test_results_do_not_depend_on_batch_neighbours() -> None:
    """A request's output is the same alone or inside a mixed batch."""
    full = build_paged_batch(MIXED, 4, 2, head_dim=32, block_size=16, seed=11)
    args = (full.q, full.k_cache, full.v_cache, full.block_tables, full.query_start_loc, full.seq_lens)
    out_full = triton_attention().paged_attention(*args, 0.2, num_kv_splits=1)
    lo, hi = int(full.query_start_loc[1]), int(full.query_start_loc[2])
    alone = triton_attention().paged_attention(
        full.q[lo:hi],
        full.k_cache,
        full.v_cache,
        full.block_tables[1:2],
        torch.tensor([0, hi - lo], dtype=torch.int32, device=DEVICE),
        full.seq_lens[1:2],
        0.2,
        num_kv_splits=1,
    )
    assert relative_error(alone, out_full[lo:hi]) < F32_BOUND

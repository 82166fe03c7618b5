"""store_kv (reference and Triton): tokens land at their slots, slot -1 and all other slots untouched."""

from __future__ import annotations

import pytest
import torch

from prefixflow.kernels import reference
from tests.kernels.kernel_testlib import DEVICE

NUM_BLOCKS, HKV, D = 6, 2, 32


def make_inputs(block_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    num_tokens = 11
    qkv = torch.randn(num_tokens, 3 * HKV, D, generator=gen)  # K/V as strided views, as the model makes them
    slots = torch.randperm(NUM_BLOCKS * block_size, generator=gen)[:num_tokens]
    slots[[2, 5, 9]] = -1
    return qkv.to(DEVICE), slots.to(DEVICE), gen


def run(store, block_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    qkv, slots, _ = make_inputs(block_size, seed)
    key, value = qkv[:, HKV : 2 * HKV], qkv[:, 2 * HKV :]
    k_cache = torch.full((NUM_BLOCKS, block_size, HKV, D), float("nan"), device=DEVICE)
    v_cache = torch.full_like(k_cache, float("nan"))
    store(key, value, k_cache, v_cache, slots)
    return k_cache, v_cache, key, value, slots


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_store_kv_writes_exactly_the_mapped_slots(impl: str, block_size: int) -> None:
    store = (
        reference.store_kv
        if impl == "reference"
        else pytest.importorskip("prefixflow.kernels.triton_store_kv").store_kv
    )
    k_cache, v_cache, key, value, slots = run(store, block_size, seed=block_size)
    flat_k = k_cache.view(-1, HKV, D)
    flat_v = v_cache.view(-1, HKV, D)
    kept = slots >= 0
    assert torch.equal(flat_k[slots[kept]], key[kept])
    assert torch.equal(flat_v[slots[kept]], value[kept])
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool, device=DEVICE)
    untouched[slots[kept]] = False
    assert torch.isnan(flat_k[untouched]).all() and torch.isnan(flat_v[untouched]).all()
    assert int(kept.sum()) == 8


def test_triton_store_kv_matches_reference_bitwise() -> None:
    triton_store = pytest.importorskip("prefixflow.kernels.triton_store_kv").store_kv
    ref = run(reference.store_kv, 16, seed=5)
    out = run(triton_store, 16, seed=5)
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(out[1], ref[1], rtol=0, atol=0, equal_nan=True)

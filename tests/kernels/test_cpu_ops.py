"""The torch backend's norm, rotary and activation (kernels/cpu_ops.py) equal the reference bit for bit,
in float32 and bf16, on the layouts the model hands them (q and k as views into one fused qkv output),
and the per-step cos/sin reuse never serves another step's positions."""

from __future__ import annotations

import pytest
import torch

from prefixflow.kernels import build_rope_cache, cpu_ops, reference

DTYPES = [torch.float32, torch.bfloat16]


def rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float16])
@pytest.mark.parametrize("rows", [37, cpu_ops.NORM_BLOCK_ROWS + 1, 2 * cpu_ops.NORM_BLOCK_ROWS + 37])
def test_rms_norm_equals_reference(dtype: torch.dtype, rows: int) -> None:
    """Past ``BLOCKS_FROM_ROWS`` rows (a prefill chunk) a bf16/fp16 norm goes block by block, the last
    block partial; with and without a residual."""
    x, res, w = (
        rand(rows, 96, seed=rows, dtype=dtype),
        rand(rows, 96, seed=rows + 1, dtype=dtype),
        rand(96, seed=3, dtype=dtype),
    )
    out, new_res = cpu_ops.rms_norm(x, w, 1e-5, res)  # type: ignore[misc]
    want, want_res = reference.rms_norm(x, w, 1e-5, res)  # type: ignore[misc]
    assert torch.equal(out, want) and torch.equal(new_res, want_res)
    assert torch.equal(cpu_ops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_equals_reference_on_fused_qkv_views(dtype: torch.dtype) -> None:
    hq, hkv, d, t = 6, 2, 32, 23
    qkv = rand(t, (hq + 2 * hkv) * d, seed=4, dtype=dtype)
    q = qkv[:, : hq * d].reshape(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].reshape(t, hkv, d)
    cache = build_rope_cache(d, 512, 10000.0)
    for seed in (5, 6):  # two steps with different positions: the second must not reuse the first's cos/sin
        positions = torch.randint(0, 512, (t,), generator=torch.Generator().manual_seed(seed))
        got, want = cpu_ops.rotary(q, k, positions, cache), reference.rotary(q, k, positions, cache)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_rotary_positions_refilled_in_place_are_seen() -> None:
    q, k = rand(4, 2, 16, seed=7), rand(4, 1, 16, seed=8)
    cache = build_rope_cache(16, 64, 10000.0)
    positions = torch.arange(4)
    cpu_ops.rotary(q, k, positions, cache)
    positions.copy_(torch.tensor([9, 3, 40, 2]))
    assert torch.equal(cpu_ops.rotary(q, k, positions, cache)[0], reference.rotary(q, k, positions, cache)[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_equals_reference(dtype: torch.dtype) -> None:
    x = rand(19, 2 * 48, seed=9, dtype=dtype)
    assert torch.equal(cpu_ops.silu_and_mul(x), reference.silu_and_mul(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [cpu_ops.BLOCKS_FROM_ROWS + 1, 3 * cpu_ops.BLOCKS_FROM_ROWS + 17])
def test_silu_and_mul_in_row_blocks_is_the_same_bits(dtype: torch.dtype, rows: int) -> None:
    """Past the block size a bf16/fp16 input goes block by block (a prefill chunk); the last block is
    partial, and a 3-D input keeps its leading shape."""
    x = rand(rows, 2 * 40, seed=rows, dtype=dtype)
    got = cpu_ops.silu_and_mul(x)
    assert got.dtype == dtype and torch.equal(got, reference.silu_and_mul(x))
    x3 = x[: 2 * (rows // 2)].reshape(2, rows // 2, 2 * 40)
    assert torch.equal(cpu_ops.silu_and_mul(x3), reference.silu_and_mul(x3))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [cpu_ops.ROTARY_BLOCK_ROWS + 5, 3 * cpu_ops.ROTARY_BLOCK_ROWS + 1])
def test_rotary_in_row_blocks_is_the_same_bits(dtype: torch.dtype, t: int) -> None:
    hq, hkv, d = 6, 2, 32
    qkv = rand(t, (hq + 2 * hkv) * d, seed=t, dtype=dtype)
    q = qkv[:, : hq * d].reshape(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].reshape(t, hkv, d)
    before = qkv.clone()
    cache = build_rope_cache(d, 2048, 10000.0)
    positions = torch.randint(0, 2048, (t,), generator=torch.Generator().manual_seed(t))
    got, want = cpu_ops.rotary(q, k, positions, cache), reference.rotary(q, k, positions, cache)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(qkv, before)  # the inputs (views into the qkv output) are left as they were

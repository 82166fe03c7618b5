"""The native norm, rotary and SiLU-and-mul (kernels/cpu_native_ops.py, kernels/native/elementwise.c), on
bf16 and float32 rows: equal to the reference (rotary bit for bit, norm and SiLU within one bf16 rounding
step, or a few float32 ulps), a row's bits independent of the other rows and the thread count, strided
inputs read where they lie, and every call the kernel cannot take handed to ``cpu_ops``."""

from __future__ import annotations

import pytest
import torch

from prefixflow.kernels import cpu_native_ops, cpu_ops, native_build, reference
from prefixflow.kernels.rope_cache import build_rope_cache

pytestmark = pytest.mark.skipif(
    native_build.load("elementwise") is None, reason="no C compiler on this machine"
)
ROWS = [1, 5, 64, 300]
BF16 = torch.bfloat16
DTYPES = pytest.mark.parametrize("dtype", [BF16, torch.float32], ids=["bf16", "float32"])


def within_one_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    """bf16: every element equal, or one bf16 step (8 bits of mantissa) away, almost all equal. float32:
    within 8 ulps (a sum of squares and an ``exp`` in another order than torch's)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.float(), want.float()
    if got.dtype == torch.float32:
        assert ((g - w).abs() <= w.abs().clamp_min(1e-20) * 2.0**-20).all(), (g - w).abs().max()
        return
    step = w.abs().clamp_min(1e-30) * 2.0**-7
    assert ((g - w).abs() <= step).all(), (g - w).abs().max()
    assert (got != want).float().mean() < 0.01


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    saved = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(saved)


@DTYPES
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", [576, 64])
def test_rms_norm_equals_the_reference(rows, hidden, threads, dtype):
    gen = torch.Generator().manual_seed(rows * hidden)
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    residual = torch.randn(rows, hidden, generator=gen).to(dtype)
    weight = (torch.rand(hidden, generator=gen) + 0.5).to(dtype)
    out, summed = cpu_native_ops.rms_norm(x, weight, 1e-5, residual)
    want, want_sum = reference.rms_norm(x, weight, 1e-5, residual)
    assert torch.equal(summed, want_sum)  # the residual sum is one rounding, as torch's
    within_one_rounding(out, want)
    within_one_rounding(cpu_native_ops.rms_norm(x, weight, 1e-5), reference.rms_norm(x, weight, 1e-5))


@DTYPES
@pytest.mark.parametrize("rows", ROWS)
def test_silu_and_mul_equals_the_reference(rows, threads, dtype):
    gen = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 2 * 1536, generator=gen) * 4).to(dtype)
    x[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # exp's clamps and signed zero
    within_one_rounding(cpu_native_ops.silu_and_mul(x), reference.silu_and_mul(x))


@DTYPES
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("heads", "head_dim"), [((9, 3), 64), ((4, 1), 128), ((2, 2), 32)])
def test_rotary_equals_the_reference_bit_for_bit(rows, heads, head_dim, threads, dtype):
    hq, hkv = heads
    gen = torch.Generator().manual_seed(rows + head_dim)
    qkv = torch.randn(rows, (hq + 2 * hkv) * head_dim, generator=gen).to(dtype)
    # q and k as the attention layer has them: views into the fused projection's output
    q, k, _ = qkv.split([hq * head_dim, hkv * head_dim, hkv * head_dim], dim=-1)
    q, k = q.reshape(rows, hq, head_dim), k.reshape(rows, hkv, head_dim)
    cache = build_rope_cache(head_dim, 4096, 10000.0)
    positions = torch.randint(0, 4096, (rows,), generator=gen)
    got_q, got_k = cpu_native_ops.rotary(q, k, positions, cache)
    want_q, want_k = reference.rotary(q, k, positions, cache)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert got_q.is_contiguous() and got_k.is_contiguous()
    got_q32, _ = cpu_native_ops.rotary(q, k, positions.to(torch.int32), cache)
    assert torch.equal(got_q32, want_q)


@DTYPES
def test_a_rows_bits_do_not_depend_on_the_other_rows(dtype):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(200, 576, generator=gen).to(dtype)
    residual = torch.randn(200, 576, generator=gen).to(dtype)
    weight = (torch.rand(576, generator=gen) + 0.5).to(dtype)
    gate_up = torch.randn(200, 3072, generator=gen).to(dtype)
    q = torch.randn(200, 9, 64, generator=gen).to(dtype)
    k = torch.randn(200, 3, 64, generator=gen).to(dtype)
    cache = build_rope_cache(64, 512, 10000.0)
    positions = torch.arange(200)
    out, summed = cpu_native_ops.rms_norm(x, weight, 1e-5, residual)
    act = cpu_native_ops.silu_and_mul(gate_up)
    rq, rk = cpu_native_ops.rotary(q, k, positions, cache)
    for row in (0, 77, 199):
        one = slice(row, row + 1)
        alone, alone_sum = cpu_native_ops.rms_norm(x[one], weight, 1e-5, residual[one])
        assert torch.equal(alone, out[one]) and torch.equal(alone_sum, summed[one])
        assert torch.equal(cpu_native_ops.silu_and_mul(gate_up[one]), act[one])
        aq, ak = cpu_native_ops.rotary(q[one], k[one], positions[one], cache)
        assert torch.equal(aq, rq[one]) and torch.equal(ak, rk[one])


@DTYPES
def test_strided_rows_are_read_where_they_lie(dtype):
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(6, 1024, generator=gen).to(dtype)
    x = wide[:, 100:676]  # rows 1,024 elements apart
    weight = (torch.rand(576, generator=gen) + 0.5).to(dtype)
    within_one_rounding(
        cpu_native_ops.rms_norm(x, weight, 1e-6), reference.rms_norm(x.contiguous(), weight, 1e-6)
    )
    gate_up = torch.randn(6, 4000, generator=gen).to(dtype)[:, :3072]
    within_one_rounding(cpu_native_ops.silu_and_mul(gate_up), reference.silu_and_mul(gate_up.contiguous()))


def test_calls_the_kernel_cannot_take_go_to_cpu_ops(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    x16 = torch.randn(4, 576, generator=gen).half()  # float16 rows: no native kernel
    w16 = (torch.rand(576, generator=gen) + 0.5).half()
    assert torch.equal(cpu_native_ops.rms_norm(x16, w16, 1e-5), cpu_ops.rms_norm(x16, w16, 1e-5))
    mixed = cpu_native_ops.rms_norm(x16.float(), w16.to(BF16), 1e-5)  # weight dtype unlike the rows'
    assert torch.equal(mixed, cpu_ops.rms_norm(x16.float(), w16.to(BF16), 1e-5))
    odd = torch.randn(3, 2 * 40, generator=gen).to(BF16)  # 40 is not a multiple of 16
    assert torch.equal(cpu_native_ops.silu_and_mul(odd), cpu_ops.silu_and_mul(odd))
    q = torch.randn(2, 4, 24, generator=gen).to(BF16)  # half a head of 12: not a multiple of 16
    cache = build_rope_cache(24, 64, 10000.0)
    positions = torch.tensor([3, 9])
    got = cpu_native_ops.rotary(q, q, positions, cache)
    want = cpu_ops.rotary(q, q, positions, cache)
    assert torch.equal(got[0], want[0])
    x = torch.randn(4, 576, generator=gen).to(BF16)
    w = (torch.rand(576, generator=gen) + 0.5).to(BF16)
    calls = []
    monkeypatch.setattr(cpu_ops, "rms_norm", lambda *a: calls.append(a) or a[0])
    monkeypatch.setattr(cpu_native_ops, "USE_NATIVE", False)  # the A/B switch of benchmarks/cpu_path.py
    cpu_native_ops.rms_norm(x, w, 1e-5)
    assert len(calls) == 1


def test_a_position_outside_the_cache_is_refused():
    q = torch.zeros(2, 9, 64, dtype=BF16)
    k = torch.zeros(2, 3, 64, dtype=BF16)
    cache = build_rope_cache(64, 16, 10000.0)
    with pytest.raises(IndexError, match="outside the cos/sin cache of 16"):
        cpu_native_ops.rotary(q, k, torch.tensor([3, 16]), cache)


def _paged_caches(dtype: torch.dtype, num_blocks: int = 64, heads: int = 3, head_dim: int = 64):
    gen = torch.Generator().manual_seed(num_blocks)
    k_cache = torch.randn(num_blocks, 16, heads, head_dim, generator=gen).to(dtype)
    return k_cache, torch.randn(num_blocks, 16, heads, head_dim, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [BF16, torch.float32, torch.float16])
@pytest.mark.parametrize("tokens", [0, 1, 5, 700])
def test_store_kv_equals_the_reference(dtype, tokens, threads):
    gen = torch.Generator().manual_seed(tokens)
    k_cache, v_cache = _paged_caches(dtype)
    # k contiguous (rotary's output), v a view of the fused projection's output, rows apart
    k = torch.randn(tokens, 3, 64, generator=gen).to(dtype)
    qkv = torch.randn(tokens, 15 * 64, generator=gen).to(dtype)
    v = qkv[:, 12 * 64 :].reshape(tokens, 3, 64)
    slots = torch.randperm(64 * 16, generator=gen)[:tokens]
    slots[::3] = -1  # padding and tokens already cached: not stored
    want_k, want_v = k_cache.clone(), v_cache.clone()
    reference.store_kv(k, v, want_k, want_v, slots)
    cpu_native_ops.store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    if tokens > 1:
        assert not torch.equal(k_cache, _paged_caches(dtype)[0])  # something was stored


def test_store_kv_refuses_a_slot_outside_the_cache_before_writing():
    k_cache, v_cache = _paged_caches(BF16, num_blocks=4)
    before = k_cache.clone()
    k = torch.ones(3, 3, 64, dtype=BF16)
    with pytest.raises(IndexError, match="outside the cache of 64 slots"):
        cpu_native_ops.store_kv(k, k, k_cache, v_cache, torch.tensor([0, 5, 64]))
    assert torch.equal(k_cache, before)


def test_store_kv_converting_dtypes_takes_the_reference():
    gen = torch.Generator().manual_seed(11)
    k_cache, v_cache = _paged_caches(torch.float32, num_blocks=4)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    k = torch.randn(4, 3, 64, generator=gen).to(BF16)  # bf16 rows into a float32 cache
    slots = torch.tensor([0, 17, -1, 63])
    reference.store_kv(k, k, want_k, want_v, slots)
    cpu_native_ops.store_kv(k, k, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_float32_rows_take_the_kernel(monkeypatch):
    """Float32 (the default of a CPU without native bf16) is the kernel's, not a silent fallback."""
    for name in ("rms_norm", "rotary", "silu_and_mul"):
        monkeypatch.setattr(cpu_ops, name, lambda *a: pytest.fail("float32 call fell back to cpu_ops"))
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(3, 576, generator=gen)
    out, _ = cpu_native_ops.rms_norm(x, torch.ones(576), 1e-5, torch.randn(3, 576, generator=gen))
    cpu_native_ops.silu_and_mul(torch.randn(3, 3072, generator=gen))
    q = torch.randn(3, 9, 64, generator=gen)
    cpu_native_ops.rotary(q, q[:, :3], torch.arange(3), build_rope_cache(64, 16, 10000.0))
    assert out.dtype == torch.float32

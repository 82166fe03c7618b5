"""Real-shape checks of the Triton kernels on a CUDA GPU, bf16 (Llama-3.1-8B / 3.2-1B layer shapes).

Skipped without CUDA; run by benchmarks/gpu_check.sh (`pytest -m gpu tests/kernels`).
"""

from __future__ import annotations

import pytest
import torch

from prefixflow import kernels
from prefixflow.kernels import reference
from tests.kernels.kernel_testlib import build_paged_batch, poisoned_like, relative_error

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
BF16_BOUND = 2e-2  # bf16 operands (and bf16 P in the PV product) vs a float32-accumulated reference


def attention_args(batch):
    return (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.query_start_loc, batch.seq_lens)


def test_auto_backend_is_triton_on_cuda() -> None:
    assert kernels.select("auto", CUDA).name == "triton"


@pytest.mark.parametrize("heads_dim", [(32, 8, 128), (32, 8, 64), (8, 1, 128)], ids=["8b", "1b", "mqa"])
@pytest.mark.parametrize("block_size", [16, 32])
def test_attention_real_mixed_step(heads_dim: tuple[int, int, int], block_size: int) -> None:
    from prefixflow.kernels import triton_attention

    hq, hkv, d = heads_dim
    shapes = [(1, 1500), (1, 900), (256, 768), (300, 300), (1, 2048), (129, 2000)]
    batch = build_paged_batch(shapes, hq, hkv, d, block_size, dtype=torch.bfloat16, device=CUDA, seed=d)
    ref = reference.paged_attention(*attention_args(batch), d**-0.5)
    out = poisoned_like(batch.q)
    triton_attention.paged_attention(*attention_args(batch), d**-0.5, out=out)
    assert relative_error(out, ref) < BF16_BOUND


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [None, 1, 8])
def test_attention_small_decode_batch(dtype: torch.dtype, splits: int | None) -> None:
    """Four long decodes: the automatic choice takes the split-KV path here."""
    from prefixflow.kernels import triton_attention

    batch = build_paged_batch([(1, 4000), (1, 17), (1, 2500), (1, 1024)], 32, 8, 128, 16, dtype, CUDA, seed=5)
    ref = reference.paged_attention(*attention_args(batch), 128**-0.5)
    out = poisoned_like(batch.q)
    triton_attention.paged_attention(*attention_args(batch), 128**-0.5, out=out, num_kv_splits=splits)
    assert relative_error(out, ref) < (BF16_BOUND if dtype == torch.bfloat16 else 1e-5)


def test_attention_decode_is_cuda_graph_safe() -> None:
    """Captured once, replayed with new lengths written into the same input buffers."""
    from prefixflow.kernels import triton_attention

    batch = build_paged_batch([(1, 600)] * 8, 32, 8, 128, 16, torch.bfloat16, CUDA, seed=9)
    out = torch.empty_like(batch.q)
    args = attention_args(batch)
    triton_attention.paged_attention(*args, 0.088, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        triton_attention.paged_attention(*args, 0.088, out=out)
    batch.seq_lens.copy_(torch.tensor([600, 1, 37, 599, 300, 64, 65, 128], dtype=torch.int32))
    batch.q.normal_()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref = reference.paged_attention(*args, 0.088)
    assert relative_error(out, ref) < BF16_BOUND


def test_store_kv_real_shape() -> None:
    from prefixflow.kernels import triton_store_kv

    k_cache = torch.full((2048, 16, 8, 128), float("nan"), dtype=torch.bfloat16, device=CUDA)
    v_cache = torch.full_like(k_cache, float("nan"))
    key = torch.randn(4096, 8, 128, dtype=torch.bfloat16, device=CUDA)
    value = torch.randn_like(key)
    slots = torch.randperm(2048 * 16, device=CUDA)[:4096]
    slots[::7] = -1
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    reference.store_kv(key, value, ref_k, ref_v, slots)
    triton_store_kv.store_kv(key, value, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache, ref_k, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, ref_v, rtol=0, atol=0, equal_nan=True)


def test_rms_norm_real_shape() -> None:
    from prefixflow.kernels import triton_norm

    x = torch.randn(4096, 4096, dtype=torch.bfloat16, device=CUDA)
    res = torch.randn_like(x)
    w = torch.randn(4096, dtype=torch.bfloat16, device=CUDA)
    out, res_out = poisoned_like(x), poisoned_like(x)
    triton_norm.rms_norm(x, w, 1e-5, res, out=out, residual_out=res_out)
    ref_out, ref_res = reference.rms_norm(x, w, 1e-5, res)
    assert torch.equal(res_out, ref_res)
    assert relative_error(out, ref_out) < 1e-2


def test_rotary_and_silu_real_shape() -> None:
    from prefixflow.kernels import triton_activation, triton_rotary

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    cache = kernels.build_rope_cache(128, 131072, 500000.0, scaling).to(CUDA)
    q = torch.randn(4096, 32, 128, dtype=torch.bfloat16, device=CUDA)
    k = torch.randn(4096, 8, 128, dtype=torch.bfloat16, device=CUDA)
    pos = torch.randint(0, 131072, (4096,), device=CUDA)
    out = (poisoned_like(q), poisoned_like(k))
    triton_rotary.rotary(q, k, pos, cache, out=out)
    q_ref, k_ref = reference.rotary(q, k, pos, cache)
    assert relative_error(out[0], q_ref) < 1e-2 and relative_error(out[1], k_ref) < 1e-2

    x = torch.randn(4096, 2 * 14336, dtype=torch.bfloat16, device=CUDA)
    act = poisoned_like(x[:, :14336])
    triton_activation.silu_and_mul(x, out=act)
    assert relative_error(act, reference.silu_and_mul(x)) < 1e-2

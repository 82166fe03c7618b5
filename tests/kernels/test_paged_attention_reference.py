"""The torch reference paged attention against dense causal SDPA on the unpaged K/V."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixflow.kernels import reference
from tests.kernels.kernel_testlib import PagedBatch, build_paged_batch, relative_error


def dense_attention(batch: PagedBatch, scale: float) -> torch.Tensor:
    """Each request's queries vs its whole dense context, bottom-right aligned causal mask."""
    num_q_heads = batch.q.shape[1]
    outs = []
    for b, query_len in enumerate(batch.query_lens):
        lo = int(batch.query_start_loc[b])
        k, v = batch.dense_k[b].float(), batch.dense_v[b].float()
        seq_len = k.shape[0]
        rep = num_q_heads // k.shape[1]
        k = k.repeat_interleave(rep, dim=1).transpose(0, 1)  # [Hq, L, D]
        v = v.repeat_interleave(rep, dim=1).transpose(0, 1)
        q = batch.q[lo : lo + query_len].float().transpose(0, 1)  # [Hq, Tq, D]
        q_pos = torch.arange(seq_len - query_len, seq_len)[:, None]
        mask = (torch.arange(seq_len)[None, :] <= q_pos).to(q.device)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs).to(batch.q.dtype)


def run_reference(batch: PagedBatch, scale: float) -> torch.Tensor:
    return reference.paged_attention(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.query_start_loc,
        batch.seq_lens,
        scale,
    )


@pytest.mark.parametrize("heads", [(4, 2), (4, 1), (4, 4)], ids=["gqa", "mqa", "mha"])
@pytest.mark.parametrize("block_size", [16, 32])
def test_reference_matches_dense_sdpa_on_mixed_batch(heads: tuple[int, int], block_size: int) -> None:
    shapes = [(1, 37), (7, 30), (20, 20)]  # decode, chunk over a cached prefix, fresh prefill
    batch = build_paged_batch(shapes, *heads, head_dim=32, block_size=block_size, device=torch.device("cpu"))
    scale = 32**-0.5
    assert relative_error(run_reference(batch, scale), dense_attention(batch, scale)) < 1e-5


@settings(max_examples=15, deadline=None)
@given(
    lens=st.lists(
        st.tuples(st.integers(1, 40), st.integers(0, 60)).map(lambda t: (t[0], t[0] + t[1])),
        min_size=1,
        max_size=4,
    ),
    heads=st.sampled_from([(2, 1), (4, 2), (3, 3), (8, 2)]),
    block_size=st.sampled_from([1, 2, 8, 16, 64]),
    head_dim=st.sampled_from([8, 16]),
    seed=st.integers(0, 2**16),
)
def test_reference_matches_dense_sdpa_random_shapes(
    lens: list[tuple[int, int]], heads: tuple[int, int], block_size: int, head_dim: int, seed: int
) -> None:
    batch = build_paged_batch(lens, *heads, head_dim, block_size, device=torch.device("cpu"), seed=seed)
    scale = 0.3
    assert relative_error(run_reference(batch, scale), dense_attention(batch, scale)) < 1e-5


@pytest.mark.parametrize("pad_with_minus_one", [False, True])
def test_reference_decode_batch_of_mixed_lengths(pad_with_minus_one: bool) -> None:
    """Short decodes take the padded batched path, the 700-token one the per-request path; table
    padding (NaN block or -1) must not matter."""
    shapes = [(1, n) for n in (17, 1, 700, 5, 16, 200, 33)] + [(4, 9)]
    batch = build_paged_batch(shapes, 4, 2, head_dim=32, block_size=16, device=torch.device("cpu"), seed=4)
    if pad_with_minus_one:
        lens = batch.seq_lens.tolist()
        for b, n in enumerate(lens):
            batch.block_tables[b, -(-n // 16) :] = -1
    assert relative_error(run_reference(batch, 0.17), dense_attention(batch, 0.17)) < 1e-5


def test_reference_ignores_cache_beyond_the_context() -> None:
    """NaN-filled spare slots and table padding never reach the output."""
    batch = build_paged_batch([(3, 5), (1, 17)], 2, 1, 16, block_size=16, device=torch.device("cpu"))
    assert torch.isnan(batch.k_cache).any()
    out = run_reference(batch, 0.25)
    assert not torch.isnan(out).any()

"""The batch-invariant CPU paged attention (kernels/invariant_attention.py) equals the reference on
NaN-poisoned caches, and gives a request's rows the same bits alone, beside other requests, cut into
prefill chunks, or with the per-call budget forcing one row per call."""

from __future__ import annotations

import pytest
import torch

from prefixflow.kernels import invariant_attention, reference
from tests.kernels.kernel_testlib import build_paged_batch, relative_error, request_alone, step_args

MIXED = [(1, 40), (1, 300), (7, 7), (3, 150), (1, 1), (33, 80), (1, 129), (5, 200)]
TARGET = (33, 80)  # request 5 of MIXED: a prefill chunk over a partly cached context


@pytest.mark.parametrize(
    ("heads", "dtype"),
    [((8, 2, 32), torch.float32), ((4, 1, 64), torch.float32), ((6, 6, 16), torch.bfloat16)],
    ids=["gqa", "mqa", "mha-bf16"],
)
def test_invariant_equals_reference(heads, dtype):
    hq, hkv, d = heads
    batch = build_paged_batch(
        MIXED, hq, hkv, d, block_size=16, dtype=dtype, device=torch.device("cpu"), seed=d
    )
    want = reference.paged_attention(*step_args(batch), d**-0.5)
    got = invariant_attention.paged_attention_invariant(*step_args(batch), d**-0.5)
    assert not torch.isnan(got).any()
    assert relative_error(got, want) < (1e-2 if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_do_not_depend_on_the_rest_of_the_step(dtype, monkeypatch):
    batch = build_paged_batch(MIXED, 9, 3, 64, block_size=16, dtype=dtype, device=torch.device("cpu"), seed=5)
    b = MIXED.index(TARGET)
    start = int(batch.query_start_loc[b])
    attend = invariant_attention.paged_attention_invariant
    together = attend(*step_args(batch), 0.125)[start : start + TARGET[0]]
    alone = attend(*request_alone(batch, b), 0.125)
    assert torch.equal(together, alone)
    first, rest = (
        attend(*request_alone(batch, b, slice(0, 20)), 0.125),
        attend(*request_alone(batch, b, slice(20, 33)), 0.125),
    )
    assert torch.equal(torch.cat([first, rest]), alone)  # the same prompt cut into two prefill chunks
    assert torch.equal(
        attend(*request_alone(batch, b, slice(32, 33)), 0.125), alone[32:]
    )  # the last row alone
    monkeypatch.setattr(invariant_attention, "_KV_BUDGET", 1)  # one row per call
    assert torch.equal(attend(*step_args(batch), 0.125)[start : start + TARGET[0]], alone)

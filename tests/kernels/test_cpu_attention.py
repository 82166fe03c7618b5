"""The batched CPU paged attention (kernels/cpu_attention.py, the torch backend's engine path) equals
the per-request reference on NaN-poisoned caches: decodes, prefill chunks, scoring continuations over
long cached contexts, GQA/MQA, bf16, and chunking forced down to one request per chunk."""

from __future__ import annotations

import pytest
import torch

from prefixflow.kernels import cpu_attention, reference
from tests.kernels.kernel_testlib import build_paged_batch, relative_error

MIXED = [(1, 40), (1, 300), (7, 7), (3, 150), (1, 1), (33, 80), (1, 129), (5, 200)]


def _args(batch):
    return (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.query_start_loc, batch.seq_lens)


@pytest.mark.parametrize(
    ("heads", "dtype"),
    [((8, 2, 32), torch.float32), ((4, 1, 64), torch.float32), ((6, 6, 16), torch.bfloat16)],
    ids=["gqa", "mqa", "mha-bf16"],
)
def test_batched_equals_reference(heads, dtype):
    hq, hkv, d = heads
    batch = build_paged_batch(
        MIXED, hq, hkv, d, block_size=16, dtype=dtype, device=torch.device("cpu"), seed=d
    )
    want = reference.paged_attention(*_args(batch), d**-0.5)
    got = cpu_attention.paged_attention(*_args(batch), d**-0.5)
    assert not torch.isnan(got).any()
    assert relative_error(got, want) < (1e-2 if dtype == torch.bfloat16 else 1e-5)


def test_one_request_per_chunk_is_the_same(monkeypatch):
    batch = build_paged_batch(MIXED, 8, 2, 32, block_size=8, device=torch.device("cpu"), seed=1)
    together = cpu_attention.paged_attention(*_args(batch), 0.2)
    monkeypatch.setattr(cpu_attention, "_KV_BUDGET", 1)
    alone = cpu_attention.paged_attention(*_args(batch), 0.2)
    assert torch.allclose(together, alone, atol=1e-6)
    assert relative_error(alone, reference.paged_attention(*_args(batch), 0.2)) < 1e-5


def test_more_queries_than_context_is_an_error():
    batch = build_paged_batch([(4, 4)], 2, 1, 16, block_size=4, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="2 context tokens"):
        cpu_attention.paged_attention(
            batch.q,
            batch.k_cache,
            batch.v_cache,
            batch.block_tables,
            batch.query_start_loc,
            torch.tensor([2], dtype=torch.int32),
            0.25,
        )


def test_prompts_without_cached_context_take_the_causal_path():
    batch = build_paged_batch(
        [(32, 32), (32, 32), (32, 32)], 4, 2, 16, block_size=16, device=torch.device("cpu"), seed=3
    )
    got = cpu_attention.paged_attention(*_args(batch), 0.25)
    assert relative_error(got, reference.paged_attention(*_args(batch), 0.25)) < 1e-5


def test_plan_is_reused_for_equal_metadata_and_rebuilt_after_an_in_place_refill():
    batch = build_paged_batch(MIXED, 8, 2, 32, block_size=16, device=torch.device("cpu"), seed=4)
    first = cpu_attention.paged_attention(*_args(batch), 0.2)
    again = cpu_attention.paged_attention(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables.clone(),
        batch.query_start_loc.clone(),
        batch.seq_lens.clone(),
        0.2,
    )
    assert torch.equal(first, again)
    batch.seq_lens.sub_(
        torch.tensor([0, 9, 0, 4, 0, 0, 17, 3], dtype=torch.int32)
    )  # shorter contexts, same tensors
    got = cpu_attention.paged_attention(*_args(batch), 0.2)
    assert relative_error(got, reference.paged_attention(*_args(batch), 0.2)) < 1e-5


DECODES = [(1, 40), (1, 300), (1, 150), (1, 1), (1, 80), (1, 129), (1, 200)]


@pytest.mark.parametrize("heads", [(9, 3, 64), (4, 1, 64), (6, 6, 16)], ids=["gqa", "mqa", "mha"])
def test_bf16_decodes_skip_sdpa_and_match_it(heads, monkeypatch):
    """A decode-only bf16 step takes the two-matmul path (SDPA is never called), equals the reference
    on a NaN-poisoned cache and agrees with what SDPA gives for the same step."""
    hq, hkv, d = heads
    monkeypatch.setattr(cpu_attention, "_SDPA_DECODES", False)  # as on a CPU without AMX tiles
    batch = build_paged_batch(
        DECODES, hq, hkv, d, block_size=16, dtype=torch.bfloat16, device=torch.device("cpu"), seed=d
    )
    default = cpu_attention.paged_attention(*_args(batch), d**-0.5)
    with monkeypatch.context() as mp:
        mp.setattr(cpu_attention, "_MATH_MIN", 1 << 40)  # every chunk on SDPA
        sdpa = cpu_attention.paged_attention(*_args(batch), d**-0.5)

    def refuse(*args, **kwargs):
        raise AssertionError("SDPA called for a bf16 decode chunk")

    monkeypatch.setattr(cpu_attention.F, "scaled_dot_product_attention", refuse)
    got = cpu_attention.paged_attention(*_args(batch), d**-0.5)
    want = reference.paged_attention(*_args(batch), d**-0.5)
    assert not torch.isnan(got).any()
    assert relative_error(got, want) < 1e-2
    assert relative_error(got, sdpa) < 1e-2
    assert torch.equal(got, default)


def _count_sdpa_calls(monkeypatch) -> list[int]:
    """The real SDPA, noting each call in the returned list."""
    calls: list[int] = []
    real = cpu_attention.F.scaled_dot_product_attention
    monkeypatch.setattr(
        cpu_attention.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    return calls


def test_bf16_decodes_stay_on_sdpa_where_the_cpu_has_amx(monkeypatch):
    monkeypatch.setattr(cpu_attention, "_SDPA_DECODES", None)
    monkeypatch.setattr(cpu_attention.torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    batch = build_paged_batch(
        DECODES, 9, 3, 64, block_size=16, dtype=torch.bfloat16, device=torch.device("cpu")
    )
    calls = _count_sdpa_calls(monkeypatch)
    got = cpu_attention.paged_attention(*_args(batch), 0.125)
    assert calls and relative_error(got, reference.paged_attention(*_args(batch), 0.125)) < 1e-2
    monkeypatch.setattr(cpu_attention, "_SDPA_DECODES", None)
    monkeypatch.setattr(cpu_attention.torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    calls.clear()
    cpu_attention.paged_attention(*_args(batch), 0.125)
    assert not calls


def test_float32_decodes_stay_on_sdpa(monkeypatch):
    batch = build_paged_batch(DECODES, 8, 2, 32, block_size=16, device=torch.device("cpu"), seed=3)
    calls = _count_sdpa_calls(monkeypatch)
    got = cpu_attention.paged_attention(*_args(batch), 0.2)
    assert calls and relative_error(got, reference.paged_attention(*_args(batch), 0.2)) < 1e-5


def test_decodes_do_not_pad_to_a_prefill_chunk_and_padding_stays_bounded():
    """Continuous batching's usual step, 32 decodes beside one 96-row prefill chunk: the decodes keep
    their own chunk (one query row each, not padded to 96), and the result still equals the reference."""
    shapes = [(1, 144)] * 32 + [(96, 96)] + [(128, 128)] * 3
    batch = build_paged_batch(
        shapes, 9, 3, 64, block_size=16, dtype=torch.bfloat16, device=torch.device("cpu")
    )
    qlens = [q for q, _ in shapes]
    lens = [s for _, s in shapes]
    order = sorted(range(len(shapes)), key=lambda b: (qlens[b], lens[b]))
    chunks = cpu_attention._split(order, qlens, lens, kv_token_bytes=2 * 3 * 64 * 2)
    for chunk in chunks:
        q_max, l_max = max(qlens[b] for b in chunk), max(lens[b] for b in chunk)
        real = sum(qlens[b] * lens[b] for b in chunk)
        assert q_max == 1 or min(qlens[b] for b in chunk) > 1, "decodes shared a chunk with longer queries"
        assert len(chunk) * q_max * l_max - real <= max(
            cpu_attention._PAD_WASTE * real, cpu_attention._PAD_FLOOR
        )
    assert sorted(b for chunk in chunks for b in chunk) == list(range(len(shapes)))
    got = cpu_attention.paged_attention(*_args(batch), 0.125)
    assert not torch.isnan(got).any()
    assert relative_error(got, reference.paged_attention(*_args(batch), 0.125)) < 1e-2

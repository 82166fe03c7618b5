"""Step inputs survive the trip through one flat int64 tensor, at any size."""

from __future__ import annotations

import numpy as np
import pytest

from prefixflow.engine.distributed.step_payload import StepBatch, pack, unpack


def _batch(tokens: int, seqs: int, width: int, rows: int, decode_only: bool) -> StepBatch:
    rng = np.random.default_rng(tokens + seqs)
    return StepBatch(
        token_ids=rng.integers(0, 150_000, tokens),
        positions=rng.integers(0, 100_000, tokens),
        slot_mapping=rng.integers(-1, 1 << 40, tokens),  # slots past 2**31 and the "do not store" -1
        query_start_loc=np.sort(rng.integers(0, tokens, seqs + 1)).astype(np.int32),
        seq_lens=rng.integers(1, 100_000, seqs).astype(np.int32),
        block_tables=rng.integers(0, 1 << 30, (seqs, width)).astype(np.int32),
        logit_rows=rng.integers(0, tokens, rows),
        decode_only=decode_only,
    )


@pytest.mark.parametrize("shape", [(1, 1, 1, 1, True), (7, 3, 4, 2, False), (70_000, 512, 300, 512, False)])
def test_round_trip(shape):
    step = _batch(*shape)
    back = unpack(pack(step).clone())
    for name in (
        "token_ids",
        "positions",
        "slot_mapping",
        "query_start_loc",
        "seq_lens",
        "block_tables",
        "logit_rows",
    ):
        got, want = getattr(back, name), getattr(step, name)
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    assert back.decode_only == step.decode_only


def test_a_truncated_payload_is_refused():
    payload = pack(_batch(7, 3, 4, 2, False))
    with pytest.raises(ValueError, match="header describes"):
        unpack(payload[:-1])

"""The tied LM head as Q8_0 blocks for decodes of few float32 rows: the blocks are recovered from the
dequantized embedding only when exact, the engine takes them where the rule says, and the logits and
tokens match the dense head's to float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

from prefixflow.engine import LLM, SamplingParams, describe_model
from prefixflow.engine.quantization.weight_path import WeightPath, packed_head
from prefixflow.kernels import cpu_gguf_matvec
from tests.engine.gguf.test_gguf_loader import tiny_hf_model, write_gguf

pytestmark = [
    pytest.mark.usefixtures("private_cache"),
    pytest.mark.skipif(
        not cpu_gguf_matvec.available(), reason="the native matvec needs a C compiler and AVX2"
    ),
]


def test_q8_0_blocks_are_recovered_exactly_or_not_at_all() -> None:
    data = np.random.default_rng(0).standard_normal((40, 96)).astype(np.float32)
    data[3, :32] = 0.0  # an all-zero block: scale 0
    raw = quants.quantize(data, Q.Q8_0)
    dense = torch.from_numpy(quants.dequantize(raw, Q.Q8_0).reshape(40, 96).copy())
    blocks = cpu_gguf_matvec.q8_0_blocks(dense)
    assert blocks is not None and torch.equal(blocks, torch.from_numpy(raw.reshape(40, 3, 34).copy()))
    assert cpu_gguf_matvec.q8_0_blocks(torch.from_numpy(data)) is None  # not a Q8_0 dequantization
    q4 = torch.from_numpy(quants.dequantize(quants.quantize(data, Q.Q4_1), Q.Q4_1).reshape(40, 96).copy())
    assert cpu_gguf_matvec.q8_0_blocks(q4) is None
    assert cpu_gguf_matvec.q8_0_blocks(dense.to(torch.bfloat16)) is None
    nudged = dense.clone()
    nudged[5, 7] = torch.nextafter(nudged[5, 7], torch.tensor(1e9))  # one weight off by one ulp
    assert cpu_gguf_matvec.q8_0_blocks(nudged) is None


def test_the_rule_is_float32_dense_plus_packed_only() -> None:
    both, dense = WeightPath("dense+packed", ""), WeightPath("dense", "")
    assert packed_head(both, "float32")
    assert (
        not packed_head(both, "bfloat16")
        and not packed_head(dense, "float32")
        and not packed_head(None, "float32")
    )
    assert not packed_head(both, "float32", batch_invariant=True)


@pytest.fixture(scope="module")
def q8_embedding_file(tmp_path_factory):
    """A tiny tied Llama as llama.cpp ships small models: Q4_1 layers, a Q8_0 embedding (the LM head)."""
    model = tiny_hf_model(tied=True)
    embedding = model.state_dict()["model.embed_tokens.weight"].float().numpy()
    raw = {"model.embed_tokens.weight": (quants.quantize(embedding, Q.Q8_0), Q.Q8_0)}
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-q8-embed.gguf", model, qtype=Q.Q4_1, raw=raw)


def test_the_engine_keeps_the_head_packed_and_matches_the_dense_head(q8_embedding_file) -> None:
    llm = LLM(str(q8_embedding_file), dtype="float32", device="cpu", num_kv_blocks=32)
    dense = LLM(str(q8_embedding_file), dtype="float32", device="cpu", num_kv_blocks=32, quantization="none")
    model = llm.engine.runner.shard.model
    assert model.packed_head is not None and dense.engine.runner.shard.model.packed_head is None
    described = describe_model(str(q8_embedding_file), dtype="float32", device="cpu")
    assert llm.model_identity == described
    assert abs(llm.stats().weight_bytes - described["weight_bytes"]) < 0.01 * described["weight_bytes"]
    hidden = torch.randn(3, model.embed_tokens.weight.shape[1])
    with torch.inference_mode():
        packed_logits = model.compute_logits(hidden)
        dense_logits = dense.engine.runner.shard.model.compute_logits(hidden)
    assert packed_logits is not None and dense_logits is not None
    assert torch.allclose(packed_logits, dense_logits, rtol=0, atol=1e-4)
    assert not torch.equal(packed_logits, dense_logits)  # the packed head did run
    prompts = [[5, 60, 70, 80], list(range(30, 75)), [9] * 20]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    assert [o.token_ids for o in llm.generate(prompts, params)] == [
        o.token_ids for o in dense.generate(prompts, params)
    ]


def test_a_tied_q4_1_embedding_keeps_the_dense_head(tmp_path) -> None:
    path = write_gguf(tmp_path / "tiny-tied-q4_1.gguf", tiny_hf_model(tied=True), qtype=Q.Q4_1)
    llm = LLM(str(path), dtype="float32", device="cpu", num_kv_blocks=16)
    model = llm.engine.runner.shard.model
    assert model.lm_head is None and model.packed_head is None  # tied, but not Q8_0 blocks
    described = describe_model(str(path), dtype="float32", device="cpu")
    assert abs(llm.stats().weight_bytes - described["weight_bytes"]) < 0.01 * described["weight_bytes"]

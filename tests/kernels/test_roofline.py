"""Roofline arithmetic on hand-computable numbers (no timing involved except one smoke run)."""

from __future__ import annotations

import json

import pytest

from benchmarks import roofline
from benchmarks.roofline import Ceilings, ModelShape

LLAMA_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}
H200 = Ceilings(bytes_per_s=4.3e12, flops_per_s=790e12, device="h200", dtype="bfloat16")


@pytest.fixture
def llama() -> ModelShape:
    return ModelShape.from_config(LLAMA_8B)


def test_llama_8b_parameter_and_kv_counts(llama: ModelShape) -> None:
    assert llama.head_dim == 128
    assert llama.total_params == 8_030_261_248  # the published Llama-3.1-8B count
    assert 2 * llama.total_params / 1e9 == pytest.approx(16.06, abs=0.005)  # the "2 x params" rule
    assert llama.matmul_params == 8_030_261_248 - 128256 * 4096 - 65 * 4096  # minus embedding gather, norms
    assert llama.kv_bytes_per_token(2) == 128 * 1024


def test_preset_file_gives_the_same_shape(llama: ModelShape, tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_8B, "head_dim": 128, "rope_theta": 5e5}))
    assert roofline.load_shape(str(tmp_path)) == llama


def test_single_token_request_costs_one_forward(llama: ModelShape) -> None:
    """prompt 1, output 1: one token computed at position 0 (1 key), one LM-head call, no decode."""
    cost = roofline.job_cost(llama, [(1, 1)])
    per_layer_attn = 4 * 32 * 128 * 1
    assert cost.flops == 2 * llama.matmul_params + 32 * per_layer_attn
    assert cost.steps == 1 and cost.kv_read_bytes == 0
    assert cost.bytes == 2 * llama.matmul_params + 128 * 1024


def test_decode_reads_whole_context_each_step(llama: ModelShape) -> None:
    """prompt 3, output 3: prefill feeds positions 0..2, decode feeds 3 and 4 (reading 4 and 5 keys);
    the third sampled token is never fed back."""
    cost = roofline.job_cost(llama, [(3, 3)])
    kvb = 128 * 1024
    assert cost.computed_tokens == 5 and cost.output_tokens == 3 and cost.steps == 3
    assert cost.kv_read_bytes == kvb * (4 + 5)
    assert cost.kv_write_bytes == kvb * 5
    keys = 1 + 2 + 3 + 4 + 5
    layer_flops = 2 * (llama.matmul_params - llama.lm_head_params) * 5
    assert cost.flops == layer_flops + 2 * llama.lm_head_params * 3 + 4 * 32 * 32 * 128 * keys
    assert cost.weight_bytes == 3 * 2 * llama.matmul_params


def test_bound_is_max_of_compute_and_memory(llama: ModelShape) -> None:
    work = [(1024, 1024)] * 256
    cost = roofline.job_cost(llama, work)
    bound = roofline.lower_bound_seconds(llama, work, H200)
    assert bound == max(cost.flops / 790e12, cost.bytes / 4.3e12)
    faster_memory = Ceilings(4.3e15, 790e12, "x", "bfloat16")
    assert roofline.lower_bound_seconds(llama, work, faster_memory) == pytest.approx(cost.flops / 790e12)


def test_decode_turns_kv_bound_near_600_tokens_of_context(llama: ModelShape) -> None:
    """Per decode token: matmul time 2*params/peak vs KV time ctx*128KiB/BW; equal near ctx ~ 620."""
    per_token_compute = 2 * llama.matmul_params / H200.flops_per_s
    crossover = per_token_compute / (llama.kv_bytes_per_token(2) / H200.bytes_per_s)
    assert 600 < crossover < 700


def test_token_budget_raises_step_count(llama: ModelShape) -> None:
    work = [(1000, 10)] * 8
    assert roofline.job_cost(llama, work).steps == 10
    assert roofline.job_cost(llama, work, max_tokens_per_step=512).steps == -(-8 * 1009 // 512)


def test_workload_specs() -> None:
    assert roofline.parse_workload("fixed:4") == [(1024, 1024)] * 4
    assert roofline.parse_workload("fixed:2:10:5") == [(10, 5)] * 2
    varied = roofline.parse_workload("varied")
    assert len(varied) == 256 and varied == roofline.varied_workload()
    assert all(100 <= p <= 1024 and 100 <= o <= 1024 for p, o in varied)


def test_cli_runs_on_cpu_with_a_tiny_shape(tmp_path, capsys) -> None:
    cfg = tmp_path / "tiny.json"
    cfg.write_text(
        json.dumps(
            {
                **LLAMA_8B,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 512,
            }
        )
    )
    out = tmp_path / "r.json"
    result = roofline.main(
        ["--model", str(cfg), "--workload", "fixed:2:8:4", "--device", "cpu", "--json", str(out)]
    )
    assert json.loads(out.read_text())["lower_bound_s"] == result["lower_bound_s"] > 0
    assert result["ceilings"]["bytes_per_s"] > 1e8 and result["ceilings"]["flops_per_s"] > 1e8
    assert "lower bound" in capsys.readouterr().out

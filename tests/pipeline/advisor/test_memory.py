"""Memory arithmetic against figures computed by hand for two preset shapes (Llama-3.1-8B, Llama-3.2-1B)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixflow.pipeline.advisor.devices import DEVICES, cpu_device, get_device
from prefixflow.pipeline.advisor.memory import EngineLimits, Footprint, fit, weight_bytes
from prefixflow.pipeline.advisor.roofline import ModelShape

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "models"


def _preset(name: str) -> tuple[ModelShape, dict]:
    cfg = json.loads((CONFIGS / f"{name}.json").read_text())
    return ModelShape.from_config(cfg), cfg


def test_llama_8b_weight_bytes_per_precision() -> None:
    shape, _ = _preset("llama-3.1-8b")
    # decoder linear layers: 32 x (4096*4096*2 q,o + 4096*1024*2 k,v + 3*4096*14336 MLP) = 6,979,321,856;
    # the rest (embedding 525,336,576 + LM head 525,336,576 + norms 266,240) = 1,050,939,392 stays 16-bit
    assert shape.total_params == 8_030_261_248
    assert weight_bytes(shape, "bf16") == 16_060_522_496
    # fp8/int8: 1 byte + one float32 scale per output channel (32 layers x 43,008 channels x 4 bytes)
    assert weight_bytes(shape, "fp8") == 6_979_321_856 + 5_505_024 + 2 * 1_050_939_392 == 9_086_705_664
    assert weight_bytes(shape, "int8") == weight_bytes(shape, "fp8")
    # int4: half a byte + per group of 128 inputs: float16 scale and float16 zero (4 bytes)
    assert weight_bytes(shape, "int4") == 3_489_660_928 + 54_525_952 * 4 + 2_101_878_784 == 5_809_643_520
    assert shape.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131_072


def test_llama_1b_weight_bytes_per_precision() -> None:
    shape, _ = _preset("llama-3.2-1b")
    # 16 x (2048*2048*2 + 2048*512*2 + 3*2048*8192) = 973,078,528 linear; tied LM head 262,668,288; norms 67,584
    assert shape.total_params == 1_235_814_400  # the published Llama-3.2-1B count
    assert weight_bytes(shape, "bf16") == 2_471_628_800
    assert weight_bytes(shape, "fp8") == 973_078_528 + 16 * 23_552 * 4 + 2 * 262_735_872 == 1_500_057_600
    assert weight_bytes(shape, "int4") == 486_539_264 + 7_602_176 * 4 + 525_471_744 == 1_042_419_712
    assert shape.kv_bytes_per_token(2) == 2 * 16 * 8 * 64 * 2 == 32_768


@pytest.mark.parametrize("name", ["llama-3.2-1b", "qwen2.5-7b"])
def test_torch_free_arithmetic_matches_the_engines_own_quantized_layout(name: str) -> None:
    """The engine builds the model on the meta device with each on-the-fly method and sums its tensors;
    the advisor's arithmetic (no torch) must give the same bytes (Qwen2.5's q/k/v biases aside)."""
    from prefixflow.engine.quantization.footprint import describe_weights

    shape, cfg = _preset(name)
    bias = (
        shape.num_layers * (shape.num_q_heads + 2 * shape.num_kv_heads) * shape.head_dim * 2
        if name.startswith("qwen")
        else 0
    )
    for engine_name, ours in ((None, "bf16"), ("int8", "int8"), ("int4", "int4"), ("fp8", "fp8")):
        assert (
            describe_weights(cfg, "bfloat16", engine_name)["weight_bytes"] == weight_bytes(shape, ours) + bias
        )


def test_llama_8b_kv_pool_on_h200() -> None:
    shape, cfg = _preset("llama-3.1-8b")
    f = fit(shape, cfg, DEVICES["h200"], EngineLimits(), "bf16", Footprint(1000, 2000))
    # activations of a 4096-token step: 4096 x (3*4096 + 48*128 + 3*14336) x 2 bytes = 503,316,480,
    # plus float32 logits and softmax of 256 rows: 256 x 128,256 x 8 = 262,668,288
    pool = int(141e9 * 0.9) - 16_060_522_496 - (503_316_480 + 262_668_288) - 2**30
    assert f.kv_pool_bytes == pool == 108_999_750_912
    assert f.kv_blocks == 108_999_750_912 // (131_072 * 16) == 51_975
    assert f.kv_tokens == 51_975 * 16 == 831_600
    assert f.max_model_len == 131_072  # the model's context fits the pool
    assert f.seqs_at_mean == 51_975 // 63 == 825  # 1,000 tokens -> 63 blocks
    assert f.seqs_at_p99 == 51_975 // 125 == 415
    assert f.headroom
    # a head of 1,000 tokens shared by every sequence is stored once: 62 blocks off the pool, and each
    # sequence keeps only its own 1,000 - 992 = 8 tokens plus its output
    shared = fit(
        shape, cfg, DEVICES["h200"], EngineLimits(), "bf16", Footprint(8 + 16, 8 + 16, shared_blocks=62)
    )
    assert shared.seqs_at_mean == (51_975 - 62) // 2 == 25_956


def test_prefill_only_jobs_need_no_decode_batch() -> None:
    shape, cfg = _preset("llama-3.1-8b")
    decoding = fit(shape, cfg, DEVICES["l4"], EngineLimits(), "bf16", Footprint(5000, 6000))
    scoring = fit(shape, cfg, DEVICES["l4"], EngineLimits(), "bf16", Footprint(5000, 6000, decodes=False))
    assert decoding.seqs_at_mean == 1764 // 313 == 5 and decoding.batch_target == 256
    assert decoding.kv_limited and not decoding.headroom
    assert scoring.batch_target == 1 and scoring.headroom


def test_llama_1b_kv_pool_on_l4_and_a_configured_pool() -> None:
    shape, cfg = _preset("llama-3.2-1b")
    f = fit(
        shape, cfg, DEVICES["l4"], EngineLimits(max_num_seqs=64, block_size=32), "bf16", Footprint(100, 100)
    )
    act = 4096 * (3 * 2048 + 48 * 64 + 3 * 8192) * 2 + 64 * 128_256 * 8
    assert f.kv_pool_bytes == int(24e9 * 0.9) - 2_471_628_800 - act - 2**30 == 17_712_138_240
    assert f.kv_blocks == 17_712_138_240 // (32_768 * 32) == 16_891
    assert f.max_model_len == 131_072
    tight = fit(
        shape, cfg, DEVICES["l4"], EngineLimits(kv_cache_memory_bytes=2**30), "bf16", Footprint(100, 100)
    )
    assert tight.kv_tokens == 2**30 // 32_768 == 32_768 and tight.max_model_len == 32_768
    assert not tight.pool_from_memory


def test_cpu_uses_the_engines_default_pool_and_float32() -> None:
    shape, cfg = _preset("llama-3.2-1b")
    cpu = cpu_device()
    f = fit(shape, cfg, cpu, EngineLimits(), "fp32", Footprint(100, 100))
    assert f.weight_bytes == 1_235_814_400 * 4
    assert f.kv_pool_bytes == 512 * 2**20
    assert f.kv_tokens == 512 * 2**20 // (32_768 * 2)  # float32 KV: 64 KiB per token


def test_unknown_gpu_names_the_choices() -> None:
    with pytest.raises(ValueError, match="h200, h100, a100-80g, l4, cpu, local"):
        get_device("v100")


def test_engine_limits_defaults_are_the_engine_configs() -> None:
    """The advisor sizes the KV pool as the engine would: its defaults must not drift from EngineConfig's."""
    import dataclasses

    from prefixflow.engine.config import EngineConfig

    engine_defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    for f in dataclasses.fields(EngineLimits):
        assert f.name in engine_defaults, f.name
        assert f.default == engine_defaults[f.name], (f.name, f.default, engine_defaults[f.name])

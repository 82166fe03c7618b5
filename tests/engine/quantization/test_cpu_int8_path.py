"""The CPU int8 path (w8a8, engine/quantization/int8_path.py): the rule, the option, what the engine
builds, what ``describe_model`` reports and digests, batch invariance, and outputs close to float32."""

from __future__ import annotations

import pytest

from prefixflow.engine import LLM, EngineConfig, SamplingParams, describe_model
from prefixflow.engine.quantization import int8_path
from prefixflow.engine.quantization.int8_path import Int8Unavailable, choose_cpu_int8
from prefixflow.engine.quantization.report import linear_kernels, weight_bytes
from prefixflow.kernels import cpu_int8

pytestmark = [
    pytest.mark.skipif(cpu_int8.int8_unsupported() is not None, reason=str(cpu_int8.int8_unsupported())),
    pytest.mark.usefixtures("private_cache"),
]
DENSE = {"path": "dense", "reason": "Q4_1 dequantized at load"}
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27], [30, 31]]


def test_the_rule() -> None:
    assert not choose_cpu_int8("off", "cpu", "float32", DENSE, "gguf").int8
    assert choose_cpu_int8("on", "cpu", "float32", None, "none").int8  # forced, on a dense checkpoint
    assert not choose_cpu_int8("auto", "cpu", "float32", None, "none").int8  # dense stays exact
    assert not choose_cpu_int8("auto", "cpu", "float32", {"path": "packed", "reason": ""}, "gguf").int8
    assert not choose_cpu_int8("auto", "cuda", "bfloat16", DENSE, "gguf").int8
    with pytest.raises(Int8Unavailable, match="CPU only"):
        choose_cpu_int8("on", "cuda", "bfloat16", None, "none")
    auto = choose_cpu_int8("auto", "cpu", "float32", DENSE, "gguf")
    assert auto.int8 == int8_path.AUTO_INT8 and "RESULTS.md" in auto.reason


def test_auto_takes_int8_for_dequantized_blocks_where_the_switch_allows(monkeypatch) -> None:
    monkeypatch.setattr(int8_path, "AUTO_INT8", True)
    assert choose_cpu_int8("auto", "cpu", "float32", DENSE, "gguf").int8
    assert not choose_cpu_int8("auto", "cpu", "bfloat16", DENSE, "gguf").int8  # float32 only
    assert not choose_cpu_int8("auto", "cpu", "float32", None, "none").int8


def test_the_option_is_checked() -> None:
    with pytest.raises(ValueError, match="cpu_int8"):
        EngineConfig(cpu_int8="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="CUDA"):
        EngineConfig(cpu_int8="on", device="cuda")


@pytest.fixture(scope="module")
def engines() -> dict[str, LLM]:
    opts = {"dtype": "float32", "device": "cpu", "num_kv_blocks": 64, "enable_prefix_caching": False}
    return {mode: LLM("tiny", cpu_int8=mode, **opts) for mode in ("off", "on")}


def test_on_builds_int8_layers_reports_and_digests_them(engines) -> None:
    off, on = (engines[m] for m in ("off", "on"))
    model = on.engine.runner.shard.model
    assert set(linear_kernels(model)) == {f"dense/{cpu_int8.INT8}"}
    assert set(linear_kernels(off.engine.runner.shard.model)) == {"dense"}
    assert weight_bytes(model) < weight_bytes(off.engine.runner.shard.model)  # int8 copies, fp32 freed
    ident = on.model_identity
    assert (
        ident["linear_kernel"]["kernel"] == cpu_int8.INT8
        and "cpu_int8='on'" in ident["linear_kernel"]["reason"]
    )
    assert ident["w8a8"]["lm_head"] == ("int8" if int8_path.INT8_LM_HEAD else "float32")
    assert "w8a8" not in off.model_identity
    assert ident["digest"] != off.model_identity["digest"]  # a resumed job cannot mix the paths


def test_int8_outputs_stay_close_to_float32(engines) -> None:
    """Bound on the tiny random model: prompt-token log-probs within 0.02 nats on average (measured
    0.003) and at least 3/4 of the greedy tokens equal (measured 22/24); the embedded model's figures are in RESULTS.md."""
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, prompt_logprobs=0)
    off, on = (engines[m].generate(PROMPTS, params) for m in ("off", "on"))
    diffs = [
        abs(a[t].logprob - b[t].logprob)
        for o, i in zip(off, on)
        for a, b, t in zip(o.prompt_logprobs[1:], i.prompt_logprobs[1:], o.prompt_token_ids[1:])
    ]
    assert 0 < sum(diffs) / len(diffs) < 0.02
    same = sum(
        x == y for o, i in zip(off, on) for x, y in zip(o.outputs[0].token_ids, i.outputs[0].token_ids)
    )
    assert same >= 0.75 * 6 * len(PROMPTS)


def test_a_rows_int8_results_are_the_same_bits_whatever_its_batch() -> None:
    def engine() -> LLM:
        return LLM(
            "tiny", dtype="float32", device="cpu", num_kv_blocks=64, cpu_int8="on", batch_invariant=True
        )

    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=2)
    alone = engine().generate(PROMPTS[2:3], params)[0].outputs[0]
    beside = engine().generate(PROMPTS, params)[2].outputs[0]
    assert beside.token_ids == alone.token_ids and beside.logprobs == alone.logprobs


def test_describe_model_and_the_engine_agree_on_a_block_file(q4_file) -> None:
    for mode in ("auto", "on", "off"):
        described = describe_model(str(q4_file), dtype="float32", device="cpu", cpu_int8=mode)
        llm = LLM(str(q4_file), dtype="float32", device="cpu", num_kv_blocks=16, cpu_int8=mode)
        assert llm.model_identity == described
        taken = described["linear_kernel"]["kernel"] == cpu_int8.INT8
        assert taken == (mode == "on" or (mode == "auto" and int8_path.AUTO_INT8))
        kernels = linear_kernels(llm.engine.runner.shard.model)
        assert (f"dense/{cpu_int8.INT8}" in kernels) == taken

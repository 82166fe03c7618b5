"""Bad quantization input fails once, clearly, before the engine runs: the message names the field or
tensor and says what is supported."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from prefixflow.engine import LLM
from prefixflow.engine.quantization import CheckpointError, QuantizationError, resolve_quantization
from tests.engine.quant_models import make_base
from tests.engine.quant_packers import Fmt, write_quantized


def _resolve(qc: dict) -> None:
    resolve_quantization({"quantization_config": qc})


@pytest.mark.parametrize(
    ("qc", "expected"),
    [
        (
            {"quant_method": "gptq", "bits": 3, "group_size": 128},
            r"quantization_config\.bits=3 .*supported: 4, 8",
        ),
        (
            {"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"},
            r"checkpoint_format='marlin' .*supported: gptq, gptq_v2",
        ),
        ({"quant_method": "gptq", "bits": 4, "is_marlin_format": True}, r"checkpoint_format='marlin'"),
        ({"quant_method": "gptq", "bits": 4, "dynamic": {"-:.*down": {}}}, r"quantization_config\.dynamic"),
        (
            {"quant_method": "bitsandbytes", "load_in_4bit": True},
            r"bitsandbytes checkpoints are not supported",
        ),
        ({"quant_method": "exl2"}, r"exllama-v2 \(exl2\) checkpoints are not supported"),
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, r"version='gemv' .*supported: gemm"),
        ({"quant_method": "awq", "bits": 8}, r"bits=8 .*supported: 4 \(AWQ\)"),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "int-quantized",
                "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8}}},
            },
            r"config_groups\.g\.format='int-quantized' .*supported: pack-quantized, float-quantized",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "pack-quantized",
                "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 2, "type": "int"}}},
            },
            r"num_bits=2 .*supported: 4 or 8",
        ),
        (
            {"quant_method": "squeezellm"},
            r"quant_method='squeezellm' .*supported: gptq, awq, compressed-tensors",
        ),
    ],
)
def test_unsupported_checkpoint_configs_name_the_field(qc, expected):
    with pytest.raises(QuantizationError, match=expected):
        _resolve(qc)


def test_unsupported_method_fails_in_the_constructor_before_loading(quant_root, tmp_path):
    base = shutil.copytree(make_base(quant_root, "llama"), tmp_path / "bits3")
    cfg = json.loads((base / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 3, "group_size": 128}
    (base / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(QuantizationError, match=r"bits=3"):
        LLM(str(base), dtype="float32", device="cpu")


def test_bad_quantization_option():
    with pytest.raises(
        ValueError,
        match=r"EngineConfig\.quantization='int3' is invalid; expected None or one of int8, int4, fp8, none",
    ):
        LLM("tiny", quantization="int3")
    with pytest.raises(QuantizationError, match=r"already quantized \(gptq\)"):
        resolve_quantization({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "int8")
    with pytest.raises(QuantizationError, match=r"quantization='awq', but .*quant_method is gptq"):
        resolve_quantization({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "awq")
    with pytest.raises(
        QuantizationError, match=r"quantization='none' asks for dense weights, but this is a gptq"
    ):
        resolve_quantization({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "none")
    assert resolve_quantization({"quantization_config": {"quant_method": "gguf"}}, "none").method == "none"


@pytest.fixture(scope="module")
def gptq_dir(quant_root):
    fmt = Fmt("gptq", 4, 128, sym=False, act_order=True)
    quant_dir, _, _ = write_quantized(make_base(quant_root, "llama"), quant_root, fmt)
    return quant_dir


def _edit(src, dst, change):
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_missing_tensor_is_named(gptq_dir, tmp_path):
    bad = _edit(gptq_dir, tmp_path / "missing", lambda t: t.pop("model.layers.1.self_attn.k_proj.qzeros"))
    with pytest.raises(
        CheckpointError, match=r"missing 1 tensors .*model\.layers\.1\.self_attn\.k_proj\.qzeros"
    ):
        LLM(str(bad), dtype="float32", device="cpu")


def test_mismatched_shape_is_named(gptq_dir, tmp_path):
    def truncate(t):
        name = "model.layers.0.mlp.down_proj.scales"
        t[name] = t[name][:, :-8].contiguous()

    bad = _edit(gptq_dir, tmp_path / "shape", truncate)
    with pytest.raises(
        CheckpointError,
        match=r"model\.layers\.0\.mlp\.down_proj\.scales: shape \(3, 248\), expected \(3, 256\)",
    ):
        LLM(str(bad), dtype="float32", device="cpu")


def test_wrong_dtype_is_named(gptq_dir, tmp_path):
    def widen(t):
        t["model.layers.0.mlp.up_proj.qweight"] = t["model.layers.0.mlp.up_proj.qweight"].long()

    bad = _edit(gptq_dir, tmp_path / "dtype", widen)
    with pytest.raises(CheckpointError, match=r"up_proj\.qweight: dtype torch\.int64, expected torch\.int32"):
        LLM(str(bad), dtype="float32", device="cpu")


def test_merged_projections_must_share_act_order(gptq_dir, tmp_path):
    def shuffle(t):
        name = "model.layers.0.self_attn.v_proj.g_idx"
        t[name] = t[name].flip(0).contiguous()

    bad = _edit(gptq_dir, tmp_path / "gidx", shuffle)
    with pytest.raises(CheckpointError, match=r"v_proj\.g_idx differs from the other projections merged"):
        LLM(str(bad), dtype="float32", device="cpu")


def test_merged_projections_must_be_quantized_alike():
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 128, "modules_to_not_convert": ["k_proj"]}
    config = resolve_quantization({"quantization_config": qc})
    names = [f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]
    with pytest.raises(QuantizationError, match=r"k_proj not; projections merged into one layer"):
        config.linear_method(names)
    assert config.linear_method(["lm_head"]).name == "dense"
    assert config.linear_method(["model.layers.0.mlp.down_proj"]).name.startswith("gptq")


def test_every_checkpoint_method_the_config_accepts_has_a_reader() -> None:
    """``EngineConfig(quantization=...)`` accepts the checkpoint methods; each is a registry entry (GGUF's
    own blocks are read by the GGUF loader) and resolves to a config of that method."""
    from prefixflow.engine.config import CHECKPOINT_QUANTIZATION
    from prefixflow.engine.quantization.config import CHECKPOINT_FORMATS

    assert set(CHECKPOINT_FORMATS) | {"gguf"} == set(CHECKPOINT_QUANTIZATION)
    minimal = {
        "gptq": {"bits": 4, "group_size": 128},
        "awq": {"bits": 4, "group_size": 128, "version": "gemm"},
        "compressed-tensors": {
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "symmetric": True,
                        "strategy": "group",
                        "group_size": 128,
                    },
                }
            }
        },
    }
    for method, fields in minimal.items():
        qc = {"quant_method": method, **fields}
        assert resolve_quantization({"quantization_config": qc}, method).method == method

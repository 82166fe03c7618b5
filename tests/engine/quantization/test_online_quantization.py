"""``LLM(model, quantization="int8" | "int4" | "fp8")`` quantizes a full-precision checkpoint while loading.

Each method is checked against a dense twin whose weights this test quantizes itself, from the
documented formulas (docs/models.md): the engine's greedy tokens must equal transformers' on it.
Memory: on the linear layers of one llama-3.2-1b-shaped decoder layer (random weights), int4 holds
<= 0.32x and int8 <= 0.55x of the bfloat16 bytes, in every kernel layout (Triton, CPU float32,
CPU bfloat16).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from prefixflow import kernels
from prefixflow.engine import LLM, SamplingParams
from prefixflow.engine.distributed.context import single_rank
from prefixflow.engine.loading.model_config import ModelConfig
from prefixflow.engine.loading.presets import load_preset
from prefixflow.engine.models.llama import DecoderLayer
from prefixflow.engine.quantization import KernelContext, resolve_quantization
from prefixflow.engine.quantization.report import linear_kernels
from prefixflow.engine.runner.attention import make_attention_backend
from prefixflow.kernels import cpu_linear
from tests.engine.hf_models import random_prompts
from tests.engine.quant_models import hf_twin_greedy, make_base

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def int8_twin(w: np.ndarray) -> np.ndarray:
    s = np.maximum(np.abs(w).max(1, keepdims=True) / 127.0, 1e-12)
    return np.clip(np.round(w / s), -127, 127) * s


def int4_twin(w: np.ndarray, group: int = 128) -> np.ndarray:
    out = np.empty_like(w)
    for start in range(0, w.shape[1], group):
        g = w[:, start : start + group]
        lo, hi = np.minimum(g.min(1, keepdims=True), 0), np.maximum(g.max(1, keepdims=True), 0)
        s = np.maximum((hi - lo) / 15.0, 1e-8).astype(np.float16).astype(np.float32)
        z = np.clip(np.round(-lo / s), 0, 15)
        out[:, start : start + group] = (np.clip(np.round(g / s) + z, 0, 15) - z) * s
    return out


def fp8_twin(w: np.ndarray) -> np.ndarray:
    s = torch.from_numpy(np.abs(w).max(1, keepdims=True) / 448.0).float()
    return ((torch.from_numpy(w) / s).to(torch.float8_e4m3fn).float() * s).numpy()


TWINS = {"int8": int8_twin, "int4": int4_twin, "fp8": fp8_twin}


def write_twin(base, out, kind):
    shutil.copytree(base, out)
    tensors = load_file(str(out / "model.safetensors"))
    for name, t in tensors.items():
        if name.endswith(".weight") and name.rsplit(".", 2)[-2] in PROJ:
            tensors[name] = torch.from_numpy(TWINS[kind](t.float().numpy()).astype(np.float32))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
def test_on_the_fly_quantization_matches_its_dense_twin(quant_root, tmp_path, kind):
    base = make_base(quant_root, "llama")
    prompts = random_prompts(3, 3, 40, seed=9)
    llm = LLM(str(base), dtype="float32", device="cpu", quantization=kind)
    got = [list(o.token_ids) for o in llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))]
    twin = write_twin(base, tmp_path / f"twin-{kind}", kind)
    assert got == hf_twin_greedy(twin, prompts, 8, fp8_activations=kind == "fp8")
    assert llm.stats().quantization == kind
    kernels = linear_kernels(llm.engine.runner.shard.model)
    assert kernels == {f"online-{kind}/{'fp8-reference' if kind == 'fp8' else 'cpu-dequant'}": 8, "dense": 1}


@pytest.mark.parametrize(("kind", "kernel"), [("int4", "cpu-int4pack"), ("int8", "cpu-int8pack")])
def test_bfloat16_on_cpu_uses_torch_pack_kernels(quant_root, kind, kernel):
    base = make_base(quant_root, "llama")
    prompts = random_prompts(3, 5, 30, seed=2)
    choices = [["a b", "c"]] * 3
    exact = LLM(str(base), dtype="float32", device="cpu", quantization=kind).score_choices(prompts, choices)
    llm = LLM(str(base), dtype="bfloat16", device="cpu", quantization=kind)
    # the dense LM head: prepacked for oneDNN where this CPU's oneDNN reorders bf16 (kernels/cpu_linear.py)
    head = "dense" if cpu_linear.prepack_unsupported(torch.bfloat16) else f"dense/{cpu_linear.PREPACKED}"
    assert linear_kernels(llm.engine.runner.shard.model) == {f"online-{kind}/{kernel}": 8, head: 1}
    fast = llm.score_choices(prompts, choices)
    diff = np.abs(np.array(fast) - np.array(exact)).max()
    assert diff < 0.05 * np.abs(np.array(exact)).max(), (fast, exact)


def _layer_linear_bytes(kind: str | None, ctx: KernelContext, narrow: int = 1) -> int:
    """Bytes held by the linear layers of one llama-3.2-1b decoder layer after loading for ``ctx``.

    ``narrow`` divides the number of heads and the intermediate size (every layer's output count) and
    keeps every input width: bytes per output row, and so the ratios, stay those of the full shape.
    """
    preset = {k: v for k, v in load_preset("llama-3.2-1b").items() if k != "prefixflow"}
    preset["num_attention_heads"] //= narrow
    preset["num_key_value_heads"] = max(1, preset["num_key_value_heads"] // narrow)
    preset["intermediate_size"] //= narrow
    preset["head_dim"] = 64
    cfg = ModelConfig.from_hf(preset)
    quant = resolve_quantization({}, kind)
    ops = kernels.select("torch", ctx.device)
    layer = DecoderLayer(cfg, ctx.dtype, ops, make_attention_backend(ops), single_rank(cfg), quant)
    gen = torch.Generator().manual_seed(0)
    total = 0
    for linear in (
        layer.self_attn.qkv_proj,
        layer.self_attn.o_proj,
        layer.mlp.gate_up_proj,
        layer.mlp.down_proj,
    ):
        for shard, rows in enumerate(linear.out_sizes):
            w = torch.randn(rows, linear.in_features, generator=gen).to(ctx.dtype) * 0.02
            linear.load("weight", w, shard)
        linear.process_after_loading(ctx)
        total += sum(t.numel() * t.element_size() for t in linear.buffers())
        prepacked = getattr(linear.method, "prepacked", None)  # bf16 held in oneDNN's layout, not a buffer
        total += prepacked.nbytes if prepacked is not None else 0
    return total


def _check_ratios(narrow: int) -> None:
    cpu = torch.device("cpu")
    bf16 = _layer_linear_bytes(None, KernelContext(cpu, torch.bfloat16), narrow)
    q, kv, inter = 2048 // narrow, 512 // narrow, 8192 // narrow
    assert bf16 == 2 * (2048 * (q + 2 * kv) + q * 2048 + 2 * inter * 2048 + inter * 2048)
    for ctx in (KernelContext(cpu, torch.bfloat16), KernelContext(cpu, torch.float32)):
        int4, int8 = _layer_linear_bytes("int4", ctx, narrow), _layer_linear_bytes("int8", ctx, narrow)
        assert int4 <= 0.32 * bf16, (ctx.dtype, int4 / bf16)
        assert int8 <= 0.55 * bf16, (ctx.dtype, int8 / bf16)


def test_weight_bytes_ratios_on_the_llama_3_2_1b_widths():
    _check_ratios(narrow=8)  # every input width of the 1B shape, 1/8 of its outputs


@pytest.mark.slow
def test_weight_bytes_on_the_full_llama_3_2_1b_layer_shape():
    _check_ratios(narrow=1)


def test_quantization_is_part_of_the_model_description(quant_root):
    from prefixflow.engine import describe_model

    base = str(make_base(quant_root, "llama"))
    plain = describe_model(base, dtype="float32", device="cpu")
    int4 = describe_model(base, dtype="float32", device="cpu", quantization="int4")
    assert plain["quantization"] == {"method": "none"} and int4["quantization"]["method"] == "int4"
    assert int4["weight_bytes"] < plain["weight_bytes"]
    assert json.dumps(int4)  # fingerprints serialise it

"""``weight_bytes`` and the quantization method of a model, from its shapes alone (no weight is read).

Used by ``describe_model`` (job fingerprints, reports before loading). HF directories and presets
build the model on the meta device with the chosen methods; a GGUF file is summed from its tensor
table (a Q8_0/Q4_0/Q4_1 projection holds exactly its stored bytes: d, m and the codes). The loaded
engine reports the bytes it really holds (``llm.stats().weight_bytes``), which can differ slightly
where a kernel repacks (e.g. float32 group scales on the CPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from prefixflow.engine.dtypes import torch_dtype
from prefixflow.engine.quantization.config import QuantizationConfig, resolve_quantization
from prefixflow.engine.quantization.report import weight_bytes


def describe_weights(
    hf_config: dict[str, Any], dtype: str, quantization: str | None, sparsity: str | None = None
) -> dict[str, Any]:
    """``{"quantization": {...}, "weight_bytes": n}`` for a model given by its HF-shaped config
    (``weight_bytes`` None for a config the engine cannot shape; loading it fails with the reason)."""
    from prefixflow import kernels
    from prefixflow.engine.loading.model_config import ModelConfig
    from prefixflow.engine.models.llama import LlamaForCausalLM
    from prefixflow.engine.runner.attention import make_attention_backend

    quant = resolve_quantization(
        hf_config, quantization, sparsity
    )  # a bad quantization fails here, before loading
    try:
        cfg = ModelConfig.from_hf(hf_config)
    except (ValueError, KeyError, TypeError):  # not a model this engine shapes: the loader says why
        return {"quantization": quant.describe(), "weight_bytes": None}
    ops = kernels.select("torch", torch.device("cpu"))  # the kernels do not change what weights take
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, torch_dtype(dtype), ops, make_attention_backend(ops), quant=quant)
    return {"quantization": quant.describe(), "weight_bytes": weight_bytes(model)}


def describe_gguf_weights(
    path: Path,
    dtype: str,
    quantization: str | None,
    sparsity: str | None = None,
    device: str = "cpu",
    cpu_int8: str = "auto",
) -> dict[str, Any]:
    """The same for a GGUF file, from its header's tensor table, plus ``weight_path``: whether its
    packed blocks stay packed on ``device`` or run dense, and why (engine/quantization/weight_path.py)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from prefixflow.engine.gguf.header import gguf_tensor_table
    from prefixflow.engine.gguf.tensors import hf_name
    from prefixflow.engine.quantization.dual_gguf import DualGGUFMethod
    from prefixflow.engine.quantization.gguf_blocks import BLOCK_BYTES, GGUFMethod
    from prefixflow.engine.quantization.weight_path import apply_weight_path, packed_head, weight_path_for

    types: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    stored: dict[str, int] = {}
    for name, dims, type_id in gguf_tensor_table(path):
        hf = hf_name(name)
        if hf is None:
            continue
        kind = GGMLQuantizationType(type_id)
        block, size = GGML_QUANT_SIZES[kind]
        types[hf], shapes[hf] = kind.name, tuple(reversed(dims))
        stored[hf] = _numel(dims) // block * size
    qc = {"quant_method": "gguf", "tensor_types": types}
    quant: QuantizationConfig = resolve_quantization({"quantization_config": qc}, quantization, sparsity)
    path_taken = weight_path_for(quant, quantization, device, dtype, path, cpu_int8)
    quant = apply_weight_path(quant, path_taken)
    size = torch.empty((), dtype=torch_dtype(dtype)).element_size()
    total = 0
    for hf, shape in shapes.items():
        module = hf.removesuffix(".weight")
        linear = hf.endswith(".weight") and ("_proj." in hf or hf == "lm_head.weight")
        method = quant.linear_method(_merged_with(module)) if linear else None
        if isinstance(method, GGUFMethod) and types[hf] in BLOCK_BYTES:
            total += stored[hf] + (_numel(shape) * size if isinstance(method, DualGGUFMethod) else 0)
        elif method is not None and len(shape) == 2:
            total += sum(
                _numel(s.shape) * s.dtype.itemsize
                for s in method.param_specs(shape[1], [shape[0]], torch_dtype(dtype))
            )
        else:
            total += _numel(shape) * size
    embed = "model.embed_tokens.weight"
    if packed_head(path_taken, dtype) and "lm_head.weight" not in shapes and types.get(embed) == "Q8_0":
        total += stored[embed]  # the tied head's Q8_0 blocks beside the dense embedding
    out: dict[str, Any] = {"quantization": quant.describe(), "weight_bytes": total}
    if path_taken is not None:
        out["weight_path"] = path_taken.describe()
    return out


_MERGED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _merged_with(module: str) -> list[str]:
    """The checkpoint modules the engine merges with ``module`` into one layer (they share a method)."""
    parent, _, leaf = module.rpartition(".")
    for group in _MERGED:
        if leaf in group:
            return [f"{parent}.{name}" for name in group]
    return [module]


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n

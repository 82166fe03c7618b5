"""GGUF tensors → Hugging Face-named torch tensors in transformers' layout.

Linear-layer weights of type Q8_0, Q4_0 or Q4_1 stay packed: they are yielded as
``<module>.gguf_q4_1`` (etc.) uint8 ``[N, K / 32, block_bytes]`` blocks, which the engine keeps packed
(``engine/quantization/gguf_blocks.py``). Every other tensor is dequantized to the compute dtype.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, ReaderTensor
from gguf.quants import dequantize

from prefixflow.engine.gguf.reader import GGUFFile

Q = GGMLQuantizationType
SUPPORTED_TYPES: tuple[GGMLQuantizationType, ...] = (
    Q.F32,
    Q.F16,
    Q.BF16,
    Q.Q8_0,
    Q.Q4_0,
    Q.Q4_1,
    Q.Q5_0,
    Q.Q5_1,
    Q.Q2_K,
    Q.Q3_K,
    Q.Q4_K,
    Q.Q5_K,
    Q.Q6_K,
)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
# Tensors llama.cpp writes that are not model parameters (rope_freqs is folded into hf_config).
_SKIPPED = {"rope_freqs.weight"}


def hf_name(gguf_name: str) -> str | None:
    """The transformers parameter name for a llama.cpp tensor name; None for tensors that are not weights."""
    if gguf_name in _SKIPPED:
        return None
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    raise ValueError(
        f"unexpected tensor {gguf_name!r} in a llama GGUF file; this loader maps only dense Llama weights"
    )


def check_tensors(reader: GGUFFile) -> None:
    """Fail fast, before any dequantization, on tensor types or names this loader cannot turn into weights."""
    for t in reader.tensors:
        if t.tensor_type not in SUPPORTED_TYPES:
            raise ValueError(
                f"unsupported GGUF tensor type {t.tensor_type.name} (tensor {t.name!r}); "
                f"supported: {', '.join(q.name for q in SUPPORTED_TYPES)}"
            )
        hf_name(t.name)


def unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's query/key row permutation.

    The GGUF converter reorders each head's rows from HF's rotate-half layout (first half of the head's
    dims, then second half) to interleaved pairs (row i of the first half next to row i of the second),
    which is what llama.cpp's rotary kernel expects. Reading the rows as ``[head, pair, half]`` and
    swapping the last two axes restores ``[head, half, pair]``. Works for weights and 1-D biases.
    """
    rows = w.shape[0]
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


PACKED_TYPES = (Q.Q8_0, Q.Q4_0, Q.Q4_1)


def keeps_packed(t: ReaderTensor, name: str) -> bool:
    """Block-quantized weights of linear layers (not embeddings, not norms) stay packed."""
    linear = name.endswith(".weight") and ("_proj." in name or name == "lm_head.weight")
    return linear and t.tensor_type in PACKED_TYPES


def tensor_types(reader: GGUFFile) -> dict[str, str]:
    """HF name -> GGUF type name of every weight tensor (the engine's per-layer quantization choice)."""
    out = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is not None:
            out[name] = t.tensor_type.name
    return out


def packed_blocks(t: ReaderTensor) -> torch.Tensor:
    """The raw blocks of a Q8_0/Q4_0/Q4_1 matrix as uint8 ``[rows, blocks, block_bytes]``."""
    data = np.asarray(t.data, dtype=np.uint8)
    raw = data.reshape(data.shape[0], -1)
    block_bytes = {Q.Q8_0: 34, Q.Q4_0: 18, Q.Q4_1: 20}[t.tensor_type]
    return torch.from_numpy(raw.copy()).reshape(raw.shape[0], -1, block_bytes)


def dequantized(t: ReaderTensor) -> np.ndarray:
    """The tensor as float32 numpy in row-major HF orientation (GGUF lists dims fastest-first)."""
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    if t.tensor_type == Q.F32:
        return np.array(t.data, dtype=np.float32).reshape(shape)
    return dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(shape)


def iter_hf_weights(
    reader: GGUFFile, hf_config: dict[str, Any], dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` one at a time, so peak memory stays about one dequantized tensor."""
    heads, kv_heads = hf_config["num_attention_heads"], hf_config["num_key_value_heads"]
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        packed = keeps_packed(t, name)
        w = packed_blocks(t) if packed else torch.from_numpy(dequantized(t))
        if ".self_attn.q_proj." in name:
            w = unpermute_rows(w, heads)
        elif ".self_attn.k_proj." in name:
            w = unpermute_rows(w, kv_heads)
        if packed:
            yield f"{name.removesuffix('.weight')}.gguf_{t.tensor_type.name.lower()}", w.contiguous()
        else:
            yield name, w.to(dtype).contiguous()

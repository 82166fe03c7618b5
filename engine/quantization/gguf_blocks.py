"""llama.cpp's Q8_0, Q4_0 and Q4_1 blocks, kept packed: each is group-32 int8/int4 with scales (and mins).

A block covers 32 consecutive inputs of one output row:
- Q8_0 (34 bytes): float16 ``d``, 32 int8 ``q``; ``w = d * q``;
- Q4_0 (18 bytes): float16 ``d``, 16 bytes of nibbles (input ``j`` in the low nibble of byte ``j``,
  input ``j + 16`` in its high nibble); ``w = d * (q - 8)``;
- Q4_1 (20 bytes): float16 ``d``, float16 ``m``, nibbles as Q4_0; ``w = d * q + m``.
All three map exactly onto ``PackedWeight`` (zero 128, 8 or 0; ``mins`` for Q4_1), so the unpacked
weights equal ``gguf.quants.dequantize`` bit for bit. The GGUF source yields these tensors as
``<module>.gguf_q4_1`` etc., uint8 ``[N, K / 32, block_bytes]`` (rows in Hugging Face order); other
tensor types (k-quants, float) arrive dequantized.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from prefixflow.engine.quantization.config import QuantizationConfig
from prefixflow.engine.quantization.method import DenseMethod, KernelMethod, LinearMethod
from prefixflow.engine.quantization.params import CheckpointError, ParamSpec, buffer
from prefixflow.kernels.cpu_gguf_matvec import BLOCK as BLOCK  # the block layout, defined once
from prefixflow.kernels.cpu_gguf_matvec import BLOCK_BYTES as BLOCK_BYTES
from prefixflow.kernels.quant_weight import PackedWeight, dequantize, pack_along_rows

PREFIX = "gguf_"


def packed_param(kind: str) -> str:
    return PREFIX + kind.lower()


def kind_of(param: str) -> str | None:
    if not param.startswith(PREFIX):
        return None
    kind = param[len(PREFIX) :].upper()
    return kind if kind in BLOCK_BYTES else None


def _f16(raw: torch.Tensor, at: int) -> torch.Tensor:
    return raw[..., at : at + 2].contiguous().view(torch.float16)[..., 0]  # [N, blocks]


def unpack_blocks(kind: str, raw: torch.Tensor, in_features: int) -> PackedWeight:
    """uint8 ``[N, K / 32, block_bytes]`` -> ``PackedWeight`` (group 32)."""
    n, blocks, size = raw.shape
    if size != BLOCK_BYTES[kind] or blocks * BLOCK != in_features:
        raise CheckpointError(f"{kind} blocks of shape {tuple(raw.shape)} do not hold {in_features} inputs")
    d = _f16(raw, 0)
    mins = None
    if kind == "Q8_0":
        codes = raw[..., 2:].contiguous().view(torch.int8).to(torch.int32) + 128
        bits, zero = 8, 128
    else:
        nibbles = raw[..., 4:] if kind == "Q4_1" else raw[..., 2:]
        codes = torch.cat([nibbles & 15, nibbles >> 4], dim=-1).to(torch.int32)
        bits, zero = 4, (0 if kind == "Q4_1" else 8)
        if kind == "Q4_1":
            mins = _f16(raw, 2).t().contiguous()
    qweight = pack_along_rows(codes.reshape(n, in_features).t(), bits)
    return PackedWeight(qweight, d.t().contiguous(), bits, in_features, BLOCK, None, zero, mins)


def dense_from_gguf(param: str, tensor: torch.Tensor, in_features: int) -> torch.Tensor | None:
    """A packed GGUF tensor dequantized to float32 ``[N, K]`` (for layers that run dense); None otherwise."""
    kind = kind_of(param)
    if kind is None:
        return None
    return dequantize(unpack_blocks(kind, tensor, in_features))


@dataclass(frozen=True)
class GGUFConfig(QuantizationConfig):
    """Per-tensor types of the GGUF file: a layer stays packed when all its projections share one of
    Q8_0/Q4_0/Q4_1; anything else (k-quants, floats, a mix) runs dense."""

    tensor_types: dict[str, str] = field(default_factory=dict)

    method = "gguf"

    @staticmethod
    def from_dict(qc: dict[str, Any]) -> GGUFConfig:
        return GGUFConfig(dict(qc.get("tensor_types") or {}))

    def linear_method(self, prefixes: Sequence[str]) -> LinearMethod:
        kinds = {self.tensor_types.get(f"{p}.weight") for p in prefixes}
        kind = kinds.pop() if len(kinds) == 1 else None
        if kind in BLOCK_BYTES:
            assert kind is not None
            return GGUFMethod(kind)
        return DenseMethod()

    def describe(self) -> dict[str, Any]:
        linear = [
            t for name, t in self.tensor_types.items() if "_proj." in name or name.startswith("lm_head.")
        ]
        kinds = sorted(set(linear))
        return {
            "method": "gguf",
            "packed": [k for k in kinds if k in BLOCK_BYTES],
            "dequantized": [k for k in kinds if k not in BLOCK_BYTES],
        }


class GGUFMethod(KernelMethod):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.name = f"gguf-{kind.lower()}"

    def param_specs(self, in_features: int, out_sizes: Sequence[int], dtype: torch.dtype) -> list[ParamSpec]:
        if in_features % BLOCK:
            raise CheckpointError(
                f"{self.kind} needs inputs in whole blocks of {BLOCK}, layer has {in_features}"
            )
        shape = (sum(out_sizes), in_features // BLOCK, BLOCK_BYTES[self.kind])
        return [ParamSpec(packed_param(self.kind), shape, torch.uint8, 0, 1, input_pack=BLOCK)]

    def build(self, layer: nn.Module) -> PackedWeight:
        return unpack_blocks(self.kind, buffer(layer, packed_param(self.kind)), self.in_features)

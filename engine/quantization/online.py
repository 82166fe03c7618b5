"""On-the-fly quantization of a full-precision checkpoint while it loads: ``quantization="int8" | "int4" | "fp8"``.

- int8: per output channel, symmetric, round to nearest: ``s = amax / 127``, ``q`` in -127..127;
- int4: groups of 128 inputs, asymmetric, round to nearest: ``s = (max - min) / 15`` (range widened to
  include 0, stored as float16), ``zero = round(-min / s)``, ``q = clamp(round(w / s) + zero, 0, 15)``;
  a last partial group where K is not a multiple of 128;
- fp8: e4m3 weights with per-channel scales ``amax / 448``; activations quantized per token at run time.
Each checkpoint shard is quantized as it arrives (rows are independent), so a full-precision copy of
the model never exists. Embeddings and the LM head stay in the compute dtype. GGUF block tensors
are dequantized first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from prefixflow.engine.quantization.config import QuantizationConfig
from prefixflow.engine.quantization.gguf_blocks import BLOCK, dense_from_gguf, kind_of
from prefixflow.engine.quantization.method import KernelMethod, LinearMethod
from prefixflow.engine.quantization.params import CheckpointError, ParamSpec, buffer, load_shard
from prefixflow.kernels.fp8_linear import FP8, FP8_MAX, Fp8Weight
from prefixflow.kernels.quant_weight import PackedWeight, pack_along_rows

INT4_GROUP = 128


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` -> unsigned codes ``[N, K]`` (zero 128) and float32 scales ``[N]``."""
    wf = w.float()
    scale = (wf.abs().amax(-1) / 127.0).clamp(min=1e-12)
    q = torch.round(wf / scale[:, None]).clamp(-127, 127)
    return (q + 128).to(torch.int32), scale


def quantize_int4(
    w: torch.Tensor, group: int = INT4_GROUP
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``w [N, K]`` -> codes ``[N, K]`` (0..15), float16 scales and zeros ``[N, ceil(K / group)]``."""
    n, k = w.shape
    groups = -(-k // group)
    wf = torch.zeros(n, groups * group, dtype=torch.float32, device=w.device)
    wf[:, :k] = w.float()
    g = wf.view(n, groups, group)
    last = k - (groups - 1) * group  # the padding of a partial last group must not widen its range
    lo = torch.cat([g[:, :-1].amin(-1), g[:, -1, :last].amin(-1, keepdim=True)], 1).clamp(max=0)
    hi = torch.cat([g[:, :-1].amax(-1), g[:, -1, :last].amax(-1, keepdim=True)], 1).clamp(min=0)
    scale = ((hi - lo) / 15.0).clamp(min=1e-8).half().float()  # rounded to its stored precision first
    zero = torch.round(-lo / scale).clamp(0, 15)
    q = (torch.round(g / scale[..., None]) + zero[..., None]).clamp(0, 15)
    return q.view(n, -1)[:, :k].to(torch.int32), scale.half(), zero.half()


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` -> e4m3 ``[N, K]`` and float32 per-channel scales ``[N]``."""
    wf = w.float()
    scale = (wf.abs().amax(-1) / FP8_MAX).clamp(min=1e-12)
    return (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


@dataclass(frozen=True)
class OnlineConfig(QuantizationConfig):
    kind: str

    @property
    def method(self) -> str:  # type: ignore[override]
        return self.kind

    def linear_method(self, prefixes: Sequence[str]) -> LinearMethod:
        if any(p == "lm_head" or p.endswith(".lm_head") for p in prefixes):
            return super().linear_method(prefixes)
        return OnlineMethod(self.kind)

    def describe(self) -> dict[str, Any]:
        detail = {
            "int8": "per-channel symmetric",
            "int4": f"group {INT4_GROUP} asymmetric",
            "fp8": "e4m3 per-channel, dynamic per-token activations",
        }
        return {"method": self.kind, "on_the_fly": detail[self.kind]}


class OnlineMethod(KernelMethod):
    """Takes dense ``weight`` shards (or GGUF blocks) and stores them already quantized."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.name = f"online-{kind}"

    def param_specs(self, in_features: int, out_sizes: Sequence[int], dtype: torch.dtype) -> list[ParamSpec]:
        n = sum(out_sizes)
        if self.kind == "fp8":
            return [
                ParamSpec("weight", (n, in_features), FP8, 0, 1),
                ParamSpec("scale", (n,), torch.float32, 0, None),
            ]
        if self.kind == "int8":
            return [
                ParamSpec("qweight", (-(-in_features // 4), n), torch.int32, 1, 0, input_pack=4),
                ParamSpec("scales", (1, n), torch.float32, 1, None),
            ]
        groups = -(-in_features // INT4_GROUP)
        return [
            ParamSpec("qweight", (-(-in_features // 8), n), torch.int32, 1, 0, input_pack=8),
            ParamSpec("scales", (groups, n), torch.float16, 1, 0, input_pack=INT4_GROUP),
            ParamSpec("zeros", (groups, n), torch.float16, 1, 0, input_pack=INT4_GROUP),
        ]

    def checkpoint_layout(self, name: str, shard: int = 0) -> tuple[int | None, int | None, int, int]:
        if name == "weight":
            return 0, 1, 1, 1
        if kind_of(name):
            return 0, 1, 1, BLOCK
        raise CheckpointError(
            f"unexpected tensor {self.where(name, shard)}: on-the-fly {self.kind} takes dense weights"
        )

    def load(self, layer: nn.Module, name: str, tensor: torch.Tensor, shard: int) -> None:
        dense = dense_from_gguf(name, tensor, self.in_features)
        if dense is not None:
            name, tensor = "weight", dense
        if name != "weight" or shard >= len(self.out_sizes):
            raise CheckpointError(
                f"unexpected tensor {self.where(name, shard)}: on-the-fly {self.kind} takes dense weights"
            )
        if not tensor.dtype.is_floating_point or tuple(tensor.shape) != (
            self.out_sizes[shard],
            self.in_features,
        ):
            raise CheckpointError(
                f"{self.where(name, shard)}: {tensor.dtype} {tuple(tensor.shape)}, expected a float "
                f"tensor of shape {(self.out_sizes[shard], self.in_features)}"
            )
        parts: dict[str, torch.Tensor]
        if self.kind == "fp8":
            q8, s = quantize_fp8(tensor)
            parts = {"weight": q8, "scale": s}
        elif self.kind == "int8":
            codes, s = quantize_int8(tensor)
            parts = {"qweight": pack_along_rows(codes.t(), 8), "scales": s[None, :]}
        else:
            codes, s4, z4 = quantize_int4(tensor)
            parts = {"qweight": pack_along_rows(codes.t(), 4), "scales": s4.t(), "zeros": z4.t()}
        for part, value in parts.items():
            load_shard(
                layer, self.specs[part], value, shard, self.out_sizes, self.where(name, shard), self.seen
            )

    def check_complete(self) -> None:
        gaps = [i for i in range(len(self.out_sizes)) if not any(s == i for _, s in self.seen)]
        if gaps:
            raise CheckpointError(f"checkpoint is missing {', '.join(self.where('weight', i) for i in gaps)}")

    def build(self, layer: nn.Module) -> PackedWeight | Fp8Weight:
        k = self.in_features
        if self.kind == "fp8":
            return Fp8Weight(buffer(layer, "weight").clone(), buffer(layer, "scale").clone())
        if self.kind == "int8":
            return PackedWeight(buffer(layer, "qweight").clone(), buffer(layer, "scales").clone(), 8, k, k)
        return PackedWeight(
            buffer(layer, "qweight").clone(),
            buffer(layer, "scales").clone(),
            4,
            k,
            INT4_GROUP,
            buffer(layer, "zeros").clone(),
        )

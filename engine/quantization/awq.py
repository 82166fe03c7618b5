"""AWQ checkpoints, ``version: gemm`` (AutoAWQ), 4-bit with zero points.

Tensors per linear layer (K inputs, N outputs, G groups):
- ``qweight`` int32 ``[K, N / 8]``: packed along N, output ``8j + AWQ_ORDER[i]`` in nibble ``i`` of
  word ``j`` (order 0, 2, 4, 6, 1, 3, 5, 7);
- ``qzeros`` int32 ``[G, N / 8]``: packed the same way, stored as is (no offset);
- ``scales`` float16 ``[G, N]``. ``w[n, k] = (q[k, n] - zero[k // group, n]) * scales[k // group, n]``.
Loading repacks the codes along K into the engine's ``PackedWeight`` layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from prefixflow.engine.quantization.config import QuantizationConfig, field_error, matches, uniform
from prefixflow.engine.quantization.method import KernelMethod, LinearMethod
from prefixflow.engine.quantization.packing import AWQ_ORDER, narrow_scales, repack_rows, unpack_cols
from prefixflow.engine.quantization.params import ParamSpec, buffer
from prefixflow.kernels.quant_weight import PackedWeight


@dataclass(frozen=True)
class AWQConfig(QuantizationConfig):
    group_size: int
    not_converted: tuple[str, ...] = ()

    method = "awq"

    @staticmethod
    def from_dict(qc: dict[str, Any]) -> AWQConfig:
        bits = qc.get("bits", qc.get("w_bit"))
        if bits != 4:
            raise field_error("bits", bits, "4 (AWQ)")
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise field_error("version", version, "gemm (gemv, exllama, marlin and ipex exports are not)")
        if not qc.get("zero_point", True):
            raise field_error("zero_point", False, "true (AWQ with zero points)")
        group = qc.get("group_size", qc.get("q_group_size", 128))
        if not isinstance(group, int) or (group != -1 and group <= 0):
            raise field_error("group_size", group, "-1 or a positive integer")
        return AWQConfig(group_size=group, not_converted=tuple(qc.get("modules_to_not_convert") or ()))

    def quantized(self, prefix: str) -> bool:
        return not (prefix == "lm_head" or prefix.endswith(".lm_head") or matches(prefix, self.not_converted))

    def linear_method(self, prefixes: Sequence[str]) -> LinearMethod:
        if uniform(prefixes, [self.quantized(p) for p in prefixes], "are AWQ-quantized"):
            return AWQMethod(self)
        return super().linear_method(prefixes)

    def describe(self) -> dict[str, Any]:
        return {"method": "awq", "bits": 4, "group_size": self.group_size, "version": "gemm"}


class AWQMethod(KernelMethod):
    def __init__(self, cfg: AWQConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.name = f"awq-w4g{cfg.group_size}"

    def group(self, in_features: int) -> int:
        return self.cfg.group_size if self.cfg.group_size > 0 else in_features

    def param_specs(self, in_features: int, out_sizes: Sequence[int], dtype: torch.dtype) -> list[ParamSpec]:
        group = self.group(in_features)
        n, groups, words = sum(out_sizes), -(-in_features // group), -(-sum(out_sizes) // 8)
        in_dim = 0 if self.cfg.group_size > 0 else None  # one group per column: every rank keeps it
        return [
            ParamSpec("qweight", (in_features, words), torch.int32, 1, 0, output_pack=8),
            ParamSpec("qzeros", (groups, words), torch.int32, 1, in_dim, output_pack=8, input_pack=group),
            ParamSpec("scales", (groups, n), torch.float32, 1, in_dim, input_pack=group, exact_dtype=False),
        ]

    def build(self, layer: nn.Module) -> PackedWeight:
        n, k = sum(self.out_sizes), self.in_features
        codes = unpack_cols(buffer(layer, "qweight"), 4, n, AWQ_ORDER)  # [K, N]
        zeros = unpack_cols(buffer(layer, "qzeros"), 4, n, AWQ_ORDER)
        scales = narrow_scales(buffer(layer, "scales"))
        return PackedWeight(repack_rows(codes, 4), scales, 4, k, self.group(k), zeros.to(scales.dtype))

"""GPTQ checkpoints (AutoGPTQ / GPTQModel layout), 4- and 8-bit, any group size, act-order.

Tensors per linear layer (K inputs, N outputs, pack = 32 / bits, G groups of ``group_size``):
- ``qweight`` int32 ``[K / pack, N]``: packed along K, input ``k`` in bits ``(k % pack) * bits``;
- ``qzeros`` int32 ``[G, N / pack]``: packed along N the same way; ``checkpoint_format`` ``gptq``
  (v1) stores ``zero - 1``, ``gptq_v2`` the zero itself;
- ``scales`` float16 ``[G, N]``; ``g_idx`` int32 ``[K]`` (group of each input; act-order permutes it).
``w[n, k] = (q[k, n] - zero[g, n]) * scales[g, n]`` with ``g = g_idx[k]``. ``qweight`` is already
the engine's ``PackedWeight`` layout; only the zeros are unpacked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from prefixflow.engine.quantization.config import (
    QuantizationConfig,
    QuantizationError,
    field_error,
    matches,
    uniform,
)
from prefixflow.engine.quantization.method import KernelMethod, LinearMethod
from prefixflow.engine.quantization.packing import narrow_scales, unpack_cols
from prefixflow.engine.quantization.params import CheckpointError, ParamSpec, buffer
from prefixflow.kernels.quant_weight import PackedWeight

FORMATS = ("gptq", "gptq_v2")


@dataclass(frozen=True)
class GPTQConfig(QuantizationConfig):
    bits: int
    group_size: int
    desc_act: bool
    sym: bool
    checkpoint_format: str
    lm_head: bool = False
    not_converted: tuple[str, ...] = ()
    only: tuple[str, ...] = ()  # modules_in_block_to_quantize, flattened (empty: every linear layer)

    method = "gptq"

    @staticmethod
    def from_dict(qc: dict[str, Any]) -> GPTQConfig:
        bits = qc.get("bits")
        if bits not in (4, 8):
            raise field_error("bits", bits, "4, 8 (GPTQ)")
        group = qc.get("group_size", -1)
        if not isinstance(group, int) or (group != -1 and group <= 0):
            raise field_error("group_size", group, "-1 (one group per column) or a positive integer")
        fmt = str(qc.get("checkpoint_format", "gptq")).lower()
        if qc.get("is_marlin_format") or fmt not in FORMATS:
            shown = "marlin" if qc.get("is_marlin_format") else fmt
            raise field_error(
                "checkpoint_format", shown, f"{', '.join(FORMATS)} (marlin/bitblas-only exports are not)"
            )
        if qc.get("dynamic"):
            raise QuantizationError(
                "quantization_config.dynamic (GPTQModel per-module overrides) is not supported; "
                "supported: one bits/group_size for every quantized layer"
            )
        inner = qc.get("modules_in_block_to_quantize") or []
        only = tuple(name for group_ in inner for name in (group_ if isinstance(group_, list) else [group_]))
        return GPTQConfig(
            bits=bits,
            group_size=group,
            desc_act=bool(qc.get("desc_act", False)),
            sym=bool(qc.get("sym", True)),
            checkpoint_format=fmt,
            lm_head=bool(qc.get("lm_head", False)),
            not_converted=tuple(qc.get("modules_to_not_convert") or ()),
            only=only,
        )

    def quantized(self, prefix: str) -> bool:
        if prefix == "lm_head" or prefix.endswith(".lm_head"):
            return self.lm_head
        if matches(prefix, self.not_converted):
            return False
        return not self.only or any(prefix.endswith("." + name) or prefix == name for name in self.only)

    def linear_method(self, prefixes: Sequence[str]) -> LinearMethod:
        if uniform(prefixes, [self.quantized(p) for p in prefixes], "are GPTQ-quantized"):
            return GPTQMethod(self)
        return super().linear_method(prefixes)

    def describe(self) -> dict[str, Any]:
        return {
            "method": "gptq",
            "bits": self.bits,
            "group_size": self.group_size,
            "desc_act": self.desc_act,
            "sym": self.sym,
            "checkpoint_format": self.checkpoint_format,
        }


class GPTQMethod(KernelMethod):
    def __init__(self, cfg: GPTQConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.name = f"gptq-w{cfg.bits}g{cfg.group_size}"

    def param_specs(self, in_features: int, out_sizes: Sequence[int], dtype: torch.dtype) -> list[ParamSpec]:
        """Group parameters split with the inputs, except one group per column (``group_size`` -1)
        and act-order, where a rank's inputs draw on any group: every rank keeps all groups."""
        pack, group = 32 // self.cfg.bits, self.cfg.group_size
        n = sum(out_sizes)
        if group <= 0:
            groups, in_dim = 1, None
        elif self.cfg.desc_act:
            groups, in_dim = -(-self.full_in // group), None
        else:
            groups, in_dim = -(-in_features // group), 0
        unit = max(group, 1)
        return [
            ParamSpec("qweight", (-(-in_features // pack), n), torch.int32, 1, 0, input_pack=pack),
            ParamSpec(
                "qzeros", (groups, -(-n // pack)), torch.int32, 1, in_dim, output_pack=pack, input_pack=unit
            ),
            ParamSpec("scales", (groups, n), torch.float32, 1, in_dim, input_pack=unit, exact_dtype=False),
            ParamSpec("g_idx", (in_features,), torch.int32, None, 0, optional=True),
        ]

    def build(self, layer: nn.Module) -> PackedWeight:
        bits, k = self.cfg.bits, self.in_features
        zeros = unpack_cols(buffer(layer, "qzeros"), bits, sum(self.out_sizes))
        if self.cfg.checkpoint_format == "gptq":
            zeros = (
                zeros + 1
            )  # v1 stores zero - 1 (a stored 2**bits - 1 reads as 2**bits, as AutoGPTQ's kernels do)
        has_g_idx = any(name == "g_idx" for name, _ in self.seen)
        if self.cfg.desc_act and not has_g_idx:
            raise CheckpointError(f"{self.where('g_idx', 0)} is missing; desc_act=true checkpoints need it")
        # without act-order g_idx is k // group_size (as vLLM and AutoGPTQ's kernels read it: not at all)
        g_idx = buffer(layer, "g_idx").clone() if has_g_idx and self.cfg.desc_act else None
        group = self.cfg.group_size if self.cfg.group_size > 0 else k
        groups = buffer(layer, "scales").shape[0]
        if g_idx is not None and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
            raise CheckpointError(f"{self.where('g_idx', 0)} names groups outside 0..{groups - 1}")
        scales = narrow_scales(buffer(layer, "scales"))
        return PackedWeight(
            buffer(layer, "qweight").clone(), scales, bits, k, group, zeros.to(scales.dtype), -1, None, g_idx
        )

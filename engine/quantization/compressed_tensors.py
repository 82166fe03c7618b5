"""compressed-tensors checkpoints (llm-compressor): ``pack-quantized`` W4A16/W8A16 and ``float-quantized`` FP8.

pack-quantized, per linear layer (K inputs, N outputs, pack = 32 / bits, G groups):
- ``weight_packed`` int32 ``[N, K / pack]``: packed along K, input ``pack*j + i`` in bits ``i*bits`` of
  word ``j``, each value stored with a ``2**(bits-1)`` offset (signed -> unsigned);
- ``weight_scale`` ``[N, G]`` (``[N, 1]`` per channel); ``weight_zero_point`` (asymmetric only) int32
  ``[N / pack, G]`` packed along N with the same offset; ``weight_g_idx`` ``[K]`` (act-order);
  ``weight_shape`` ``[2]`` = (N, K). ``w = (q - zero) * scale`` on the signed values.
  ``weight_packed`` transposed is already the engine's ``PackedWeight.qweight`` layout.
float-quantized: ``weight`` float8_e4m3fn ``[N, K]``, ``weight_scale`` float32 per tensor (``[1]``) or
per channel (``[N, 1]``); activations dynamic per token (or static per tensor with ``input_scale``).
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
from prefixflow.engine.quantization.params import CheckpointError, ParamSpec, buffer, load_shard
from prefixflow.kernels.fp8_linear import FP8, Fp8Weight
from prefixflow.kernels.quant_weight import PackedWeight

FORMATS = ("pack-quantized", "float-quantized")


@dataclass(frozen=True)
class Scheme:
    """One config group: what its target layers hold."""

    targets: tuple[str, ...]
    format: str
    bits: int
    strategy: str  # "group" | "channel" | "tensor"
    group_size: int
    symmetric: bool
    act_order: bool
    static_input: bool  # fp8 with a stored input_scale


def _scheme(name: str, group: dict[str, Any], default_format: str) -> Scheme:
    where = f"config_groups.{name}"
    fmt = str(group.get("format") or default_format)
    if fmt not in FORMATS:
        raise field_error(f"{where}.format", fmt, ", ".join(FORMATS))
    w = group.get("weights") or {}
    bits, kind, strategy = w.get("num_bits"), w.get("type", "int"), w.get("strategy", "tensor")
    acts = group.get("input_activations")
    static_input = False
    if fmt == "pack-quantized":
        if kind != "int" or bits not in (4, 8):
            raise field_error(f"{where}.weights.num_bits", bits, "4 or 8 (type int) for pack-quantized")
        if strategy not in ("group", "channel"):
            raise field_error(f"{where}.weights.strategy", strategy, "group, channel")
        if acts:
            raise field_error(f"{where}.input_activations", acts, "null (weight-only W4A16/W8A16)")
    else:
        if kind != "float" or bits != 8:
            raise field_error(f"{where}.weights", f"{kind}{bits}", "float8 (e4m3) for float-quantized")
        if strategy not in ("tensor", "channel"):
            raise field_error(f"{where}.weights.strategy", strategy, "tensor, channel")
        if acts:
            if acts.get("type", "float") != "float" or acts.get("num_bits") != 8:
                raise field_error(f"{where}.input_activations", acts, "float8 activations")
            dynamic = acts.get("dynamic", True)
            if dynamic and acts.get("strategy", "token") not in ("token", "tensor"):
                raise field_error(
                    f"{where}.input_activations.strategy", acts.get("strategy"), "token, tensor"
                )
            if not dynamic and acts.get("strategy", "tensor") != "tensor":
                raise field_error(
                    f"{where}.input_activations.strategy", acts.get("strategy"), "tensor (static)"
                )
            static_input = not dynamic
    group_size = int(w.get("group_size") or 0) if strategy == "group" else 0
    if strategy == "group" and group_size <= 0:
        raise field_error(f"{where}.weights.group_size", w.get("group_size"), "a positive integer")
    act_order = w.get("actorder") not in (None, False, "static")
    targets = tuple(group.get("targets") or ("Linear",))
    return Scheme(
        targets, fmt, int(bits), strategy, group_size, bool(w.get("symmetric", True)), act_order, static_input
    )


@dataclass(frozen=True)
class CompressedTensorsConfig(QuantizationConfig):
    schemes: tuple[Scheme, ...]
    ignore: tuple[str, ...] = ()

    method = "compressed-tensors"

    @staticmethod
    def from_dict(qc: dict[str, Any]) -> CompressedTensorsConfig:
        groups = qc.get("config_groups") or {}
        if not groups:
            raise field_error("config_groups", groups, "at least one group of quantized layers")
        default_format = str(qc.get("format", "pack-quantized"))
        status = qc.get("quantization_status", "compressed")
        if status not in ("compressed", "frozen"):
            raise field_error("quantization_status", status, "compressed")
        schemes = tuple(_scheme(name, g, default_format) for name, g in sorted(groups.items()))
        return CompressedTensorsConfig(schemes, tuple(qc.get("ignore") or ()))

    def scheme_for(self, prefix: str) -> Scheme | None:
        if matches(prefix, [p if p.startswith("re:") else f"re:(.*\\.)?{p}$" for p in self.ignore]):
            return None
        for scheme in self.schemes:
            for target in scheme.targets:
                if (
                    target == "Linear"
                    or (target.startswith("re:") and matches(prefix, [target]))
                    or target == prefix
                ):
                    return scheme
        return None

    def linear_method(self, prefixes: Sequence[str]) -> LinearMethod:
        schemes = [self.scheme_for(p) for p in prefixes]
        if not uniform(prefixes, [s is not None for s in schemes], "are quantized"):
            return super().linear_method(prefixes)
        if len(set(schemes)) > 1:
            raise QuantizationError(
                f"{', '.join(prefixes)} use different quantization schemes; merged projections need one"
            )
        scheme = schemes[0]
        assert scheme is not None
        return PackedMethod(scheme) if scheme.format == "pack-quantized" else FloatMethod(scheme)

    def describe(self) -> dict[str, Any]:
        schemes = [
            {
                "format": s.format,
                "bits": s.bits,
                "strategy": s.strategy,
                "group_size": s.group_size,
                "symmetric": s.symmetric,
                "act_order": s.act_order,
            }
            for s in self.schemes
        ]
        return {"method": "compressed-tensors", "schemes": schemes}


class PackedMethod(KernelMethod):
    """pack-quantized int4 / int8 weights with float activations."""

    def __init__(self, scheme: Scheme) -> None:
        super().__init__()
        self.scheme = scheme
        self.name = f"compressed-tensors-w{scheme.bits}a16"

    def group(self, in_features: int) -> int:
        return self.scheme.group_size if self.scheme.strategy == "group" else in_features

    def param_specs(self, in_features: int, out_sizes: Sequence[int], dtype: torch.dtype) -> list[ParamSpec]:
        """As GPTQ's: group parameters split with the inputs unless per channel or act-order."""
        pack, group = 32 // self.scheme.bits, self.group(in_features)
        n = sum(out_sizes)
        if self.scheme.strategy == "channel":
            groups, in_dim = 1, None
        elif self.scheme.act_order:
            groups, in_dim = -(-self.full_in // group), None
        else:
            groups, in_dim = -(-in_features // group), 1
        specs = [
            ParamSpec("weight_packed", (n, -(-in_features // pack)), torch.int32, 0, 1, input_pack=pack),
            ParamSpec(
                "weight_scale", (n, groups), torch.float32, 0, in_dim, input_pack=group, exact_dtype=False
            ),
            ParamSpec("weight_shape", (2,), torch.int64, None, None, exact_dtype=False),
            ParamSpec(
                "weight_g_idx", (in_features,), torch.int32, None, 0, optional=not self.scheme.act_order
            ),
        ]
        if not self.scheme.symmetric:
            specs.append(
                ParamSpec(
                    "weight_zero_point",
                    (-(-n // pack), groups),
                    torch.int32,
                    0,
                    in_dim,
                    output_pack=pack,
                    input_pack=group,
                )
            )
        return specs

    def load(self, layer: nn.Module, name: str, tensor: torch.Tensor, shard: int) -> None:
        if (
            name == "weight_shape"
        ):  # (N, K) of the whole projection: differs per shard, so checked, not stored
            expected = [self.full_out[shard], self.full_in] if shard < len(self.full_out) else None
            if tensor.dtype.is_floating_point or tensor.tolist() != expected:
                raise CheckpointError(f"{self.where(name, shard)} = {tensor.tolist()}, expected {expected}")
            self.seen.add((name, shard))
            return
        super().load(layer, name, tensor, shard)

    def build(self, layer: nn.Module) -> PackedWeight:
        bits, k, n = self.scheme.bits, self.in_features, sum(self.out_sizes)
        qweight = buffer(layer, "weight_packed").t().contiguous()
        scales = narrow_scales(buffer(layer, "weight_scale").t().contiguous())
        zeros = None
        if not self.scheme.symmetric:
            zeros = unpack_cols(buffer(layer, "weight_zero_point").t().contiguous(), bits, n).to(scales.dtype)
        has_g = any(name == "weight_g_idx" for name, _ in self.seen)
        g_idx = buffer(layer, "weight_g_idx").clone() if has_g else None
        return PackedWeight(qweight, scales, bits, k, self.group(k), zeros, -1, None, g_idx)


class FloatMethod(KernelMethod):
    """float-quantized FP8 W8A8: e4m3 weights, per-channel scales (per-tensor ones are broadcast)."""

    def __init__(self, scheme: Scheme) -> None:
        super().__init__()
        self.scheme = scheme
        self.name = "compressed-tensors-fp8"

    def param_specs(self, in_features: int, out_sizes: Sequence[int], dtype: torch.dtype) -> list[ParamSpec]:
        n = sum(out_sizes)
        specs = [
            ParamSpec("weight", (n, in_features), FP8, 0, 1),
            ParamSpec("weight_scale", (n,), torch.float32, 0, None, exact_dtype=False),
        ]
        if self.scheme.static_input:
            specs.append(
                ParamSpec("input_scale", (len(out_sizes),), torch.float32, 0, None, exact_dtype=False)
            )
        return specs

    def checkpoint_layout(self, name: str, shard: int = 0) -> tuple[int | None, int | None, int, int]:
        if name == "input_scale" or (name == "weight_scale" and self.scheme.strategy == "tensor"):
            return None, None, 1, 1  # one value for the whole projection: every rank keeps it
        return super().checkpoint_layout(name, shard)

    def load(self, layer: nn.Module, name: str, tensor: torch.Tensor, shard: int) -> None:
        if name == "weight_scale" and shard < len(self.out_sizes):
            rows = self.out_sizes[shard]
            if tensor.numel() == 1 and self.scheme.strategy == "tensor":
                tensor = tensor.reshape(1).expand(rows)
            elif tuple(tensor.shape) in ((rows, 1), (rows,)):
                tensor = tensor.reshape(rows)
        if name == "input_scale" and shard < len(self.out_sizes):
            if tensor.numel() != 1:
                raise CheckpointError(
                    f"{self.where(name, shard)}: shape {tuple(tensor.shape)}, expected one value"
                )
            spec = self.specs[name]
            load_shard(
                layer,
                spec,
                tensor.reshape(1),
                shard,
                [1] * len(self.out_sizes),
                self.where(name, shard),
                self.seen,
            )
            return
        super().load(layer, name, tensor, shard)

    def build(self, layer: nn.Module) -> Fp8Weight:
        input_scale = None
        if self.scheme.static_input:  # one input feeds every merged projection: the largest scale covers all
            input_scale = buffer(layer, "input_scale").max().reshape(())
        return Fp8Weight(buffer(layer, "weight").clone(), buffer(layer, "weight_scale").clone(), input_scale)

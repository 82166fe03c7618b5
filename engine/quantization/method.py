"""``LinearMethod``: how one linear layer stores its weights, loads them, prepares them and multiplies.

Lifecycle, identical for every format (the model code never branches on one):
1. ``create_weights``: buffers for the checkpoint tensors, shaped for the merged layer (``ParamSpec``);
2. ``load``: one checkpoint tensor of one shard (q_proj of qkv_proj, ...) into its slice;
3. ``process_after_loading``: check nothing is missing, then repack for the device's kernel and free
   the checkpoint layout;
4. ``apply``: ``y = x W^T + b`` through that kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from prefixflow.engine.quantization.params import (
    CheckpointError,
    ParamSpec,
    allocate,
    buffer,
    load_shard,
    missing,
)
from prefixflow.kernels.cpu_int8 import INT8, Int8Weight, int8_linear, pack_int8
from prefixflow.kernels.cpu_linear import (
    PREPACKED,
    PrepackedWeight,
    dense_linear,
    linear_kernel,
    prepack,
    prepacked_linear,
)
from prefixflow.kernels.fp8_linear import Fp8Weight
from prefixflow.kernels.quant_linear import QuantKernel, fp8_kernel, weight_only_kernel
from prefixflow.kernels.quant_weight import PackedWeight


@dataclass(frozen=True)
class KernelContext:
    """Where the layer will run: decides the kernel (and so the layout) its weights are repacked into."""

    device: torch.device
    dtype: torch.dtype
    backend: str = "auto"  # the engine's kernel backend: "triton" or "torch" ("auto": by device)
    int8: bool = False  # CPU dense layers in int8 w8a8 (engine/quantization/int8_path.py decides)


class LinearMethod:
    """Base: bookkeeping of specs and loaded shards. ``name`` is what reports show for the layer."""

    name = "dense"

    def __init__(self) -> None:
        self.specs: dict[str, ParamSpec] = {}
        self.seen: set[tuple[str, int]] = set()
        self.out_sizes: list[int] = []
        self.in_features = 0
        self.dtype = torch.float32
        self.prefixes: list[str] = []
        self.full_in = 0  # inputs of the whole layer (tensor parallelism gives a rank a part)
        self.full_out: list[int] = []

    def param_specs(self, in_features: int, out_sizes: Sequence[int], dtype: torch.dtype) -> list[ParamSpec]:
        raise NotImplementedError

    def create_weights(
        self,
        layer: nn.Module,
        in_features: int,
        out_sizes: Sequence[int],
        dtype: torch.dtype,
        prefixes: Sequence[str],
        full_sizes: tuple[int, list[int]] | None = None,
    ) -> None:
        """Buffers for this layer (or this rank's part: ``full_sizes`` are the whole layer's)."""
        self.in_features, self.out_sizes, self.dtype = in_features, list(out_sizes), dtype
        self.prefixes = list(prefixes)
        self.full_in, self.full_out = full_sizes or (in_features, list(out_sizes))
        for spec in self.param_specs(in_features, out_sizes, dtype):
            self.specs[spec.name] = spec
            allocate(layer, spec)

    def where(self, name: str, shard: int) -> str:
        prefix = self.prefixes[shard] if shard < len(self.prefixes) else f"shard {shard}"
        return f"{prefix}.{name}"

    def checkpoint_layout(self, name: str, shard: int = 0) -> tuple[int | None, int | None, int, int]:
        """(output axis, input axis, outputs per stored element, inputs per stored element) of checkpoint
        tensor ``name``: how tensor parallelism cuts it before ``load``."""
        spec = self.specs.get(name)
        if spec is None:
            raise self.unexpected(name, shard)
        return spec.output_dim, spec.input_dim, spec.output_pack, spec.input_pack

    def unexpected(self, name: str, shard: int) -> CheckpointError:
        takes = ", ".join(sorted(self.specs))
        return CheckpointError(
            f"unexpected tensor {self.where(name, shard)}: this layer is {self.name} and takes {takes}"
        )

    def load(self, layer: nn.Module, name: str, tensor: torch.Tensor, shard: int) -> None:
        spec = self.specs.get(name)
        if spec is None:
            raise self.unexpected(name, shard)
        load_shard(layer, spec, tensor, shard, self.out_sizes, self.where(name, shard), self.seen)

    def check_complete(self) -> None:
        gaps = missing(list(self.specs.values()), len(self.out_sizes), self.seen)
        if gaps:
            names = [self.where(name, shard) for name, shard in gaps]
            raise CheckpointError(
                f"checkpoint is missing {len(names)} tensors of a {self.name} layer: {', '.join(names)}"
            )

    def process_after_loading(self, layer: nn.Module, ctx: KernelContext) -> None:
        self.check_complete()

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError


class DenseMethod(LinearMethod):
    """Full-precision weight ``[N, K]`` in the compute dtype; GGUF blocks arriving here are dequantized."""

    name = "dense"

    def param_specs(self, in_features: int, out_sizes: Sequence[int], dtype: torch.dtype) -> list[ParamSpec]:
        return [ParamSpec("weight", (sum(out_sizes), in_features), dtype, 0, 1, exact_dtype=False)]

    def checkpoint_layout(self, name: str, shard: int = 0) -> tuple[int | None, int | None, int, int]:
        from prefixflow.engine.quantization.gguf_blocks import BLOCK, kind_of

        return (0, 1, 1, BLOCK) if kind_of(name) else super().checkpoint_layout(name, shard)

    def load(self, layer: nn.Module, name: str, tensor: torch.Tensor, shard: int) -> None:
        from prefixflow.engine.quantization.gguf_blocks import dense_from_gguf

        converted = dense_from_gguf(name, tensor, self.in_features)
        if converted is not None:
            name, tensor = "weight", converted
        super().load(layer, name, tensor, shard)

    def __init__(self, prepack: bool = True) -> None:
        """``prepack``: let the CPU bf16 path reorder the weight for oneDNN (off for a wrapper that reads
        the dense weight after loading, like the 2:4 method)."""
        super().__init__()
        self.prepack = prepack
        self.prepacked: PrepackedWeight | None = None
        self.int8: Int8Weight | None = None

    def process_after_loading(self, layer: nn.Module, ctx: KernelContext) -> None:
        """On the CPU with ``ctx.int8`` the weight is quantized to int8 and prepacked for FBGEMM
        (kernels/cpu_int8.py); on a CPU whose oneDNN prepacks bf16 (kernels/cpu_linear.py), it is
        reordered once. Either frees the dense buffer; everywhere else it stays as loaded."""
        self.check_complete()
        if not self.prepack or ctx.device.type != "cpu":
            return
        if ctx.int8:
            self.int8 = pack_int8(buffer(layer, "weight"))
            delattr(layer, "weight")
            return
        chosen = linear_kernel("cpu", str(ctx.dtype).removeprefix("torch."))
        weight = buffer(layer, "weight")
        if chosen is not None and chosen.kernel == PREPACKED and weight.dtype == ctx.dtype:
            self.prepacked = prepack(weight)
            delattr(layer, "weight")

    @property
    def kernel_name(self) -> str:
        if self.int8 is not None:
            return INT8
        return PREPACKED if self.prepacked is not None else "torch-linear"

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.int8 is not None:
            return int8_linear(x, self.int8, bias)
        if self.prepacked is not None:
            return prepacked_linear(x, self.prepacked, bias)
        return dense_linear(x, buffer(layer, "weight"), bias)


class KernelMethod(LinearMethod):
    """A quantized method: the checkpoint buffers become one kernel's tensors in ``process_after_loading``."""

    def __init__(self) -> None:
        super().__init__()
        self.kernel: QuantKernel | None = None

    def build(self, layer: nn.Module) -> PackedWeight | Fp8Weight:
        """The canonical weight from the loaded checkpoint buffers."""
        raise NotImplementedError

    def process_after_loading(self, layer: nn.Module, ctx: KernelContext) -> None:
        self.check_complete()
        weight = self.build(layer)
        for name in self.specs:
            delattr(layer, name)
        if isinstance(weight, Fp8Weight):
            self.kernel = fp8_kernel(weight, ctx.device)
        else:
            self.kernel = weight_only_kernel(simplify(weight), ctx.dtype, ctx.device, ctx.backend)
        for name, tensor in self.kernel.tensors().items():
            layer.register_buffer(f"kernel_{name}", tensor, persistent=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.kernel is None:
            raise RuntimeError(f"{self.prefixes}: process_after_loading was not called")
        return self.kernel(x, bias)

    @property
    def kernel_name(self) -> str:
        return self.kernel.name if self.kernel is not None else "unprepared"


def simplify(w: PackedWeight) -> PackedWeight:
    """Drop what carries no information: zeros all equal to the default, a g_idx equal to k // group."""
    zeros, g_idx = w.zeros, w.g_idx
    if zeros is not None and bool((zeros == w.default_zero).all()):
        zeros = None
    if g_idx is not None:
        plain = torch.arange(w.in_features, device=g_idx.device) // w.group_size
        if torch.equal(g_idx.long(), plain):
            g_idx = None
    if zeros is w.zeros and g_idx is w.g_idx:
        return w
    return PackedWeight(
        w.qweight, w.scales, w.bits, w.in_features, w.group_size, zeros, w.default_zero, w.mins, g_idx
    )

"""2:4 structured sparsity: at most two nonzero weights in every group of four consecutive inputs.

Where it comes from:
- a compressed-tensors checkpoint's ``quantization_config.sparsity_config`` with ``sparsity_structure:
  "2:4"``, stored as ``format: "sparse-24-bitmask"`` (per layer ``compressed`` ``[N, K/2]``: the kept
  values row by row, in the weight's dtype or e4m3 for FP8; ``bitmask`` uint8 ``[N, ceil(K/8)]``: bit
  ``k % 8`` of byte ``k // 8`` (little bit order) marks input ``k`` as kept, exactly two per group;
  ``shape`` ``[2, 1]`` = (N, K)) or ``format: "dense"`` (the ordinary tensors, zeros stored). Alone,
  with FP8 (``float-quantized``, bitmask or dense) or with int4/int8 (``pack-quantized``: its packed
  codes are never bitmask-compressed, the structure is in the values);
- ``sparsity="2:4"`` on the fly: magnitude pruning per group of four (keep the two largest |w|) of a
  dense model's decoder projections, for experiments: it costs accuracy without retraining.
Every loaded group is checked: a third nonzero is a load error naming the tensor.

How it runs: on CUDA SM >= 8.0 with 16-bit dense weights, ``torch.sparse.to_sparse_semi_structured``
(cuSPARSELt or CUTLASS) for ``x @ W^T``; everywhere else the dense weights as loaded, exactly. The
choice is ``sparse_kernel`` (``describe_model`` reports it) and each layer's kernel shows in
``llm.stats()``'s linear kernels.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from prefixflow.engine.quantization.config import QuantizationConfig, QuantizationError, matches
from prefixflow.engine.quantization.method import DenseMethod, KernelContext, KernelMethod, LinearMethod
from prefixflow.engine.quantization.params import CheckpointError, ParamSpec, buffer
from prefixflow.kernels.quant_weight import PackedWeight, dequantize

FORMATS = ("sparse-24-bitmask", "dense")
BITMASK_TENSORS = ("compressed", "bitmask", "shape")
ON_THE_FLY = "on-the-fly"
ACCURACY_WARNING = (
    "sparsity='2:4' prunes half of every decoder projection's weights by magnitude without retraining: "
    "expect a real loss of accuracy (docs/models.md '2:4 sparsity' reports what it costs the embedded "
    "model); use it for speed experiments, or load a checkpoint sparsified with fine-tuning"
)


def sparse_kernel(device: torch.device, dtype: torch.dtype, quantized: bool) -> tuple[str, str]:
    """(kernel, why) for a 2:4 layer on ``device``: ``semi-structured`` or ``dense``."""
    if quantized:
        return (
            "dense",
            "quantized 2:4 weights run their quantization's kernel (no sparse quantized kernel here)",
        )
    if device.type != "cuda":
        return "dense", "exact dense matmul: semi-structured sparse kernels need CUDA SM >= 8.0"
    if dtype not in (torch.float16, torch.bfloat16):
        return (
            "dense",
            f"semi-structured sparse kernels take float16/bfloat16, not {str(dtype).removeprefix('torch.')}",
        )
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return "dense", f"semi-structured sparse kernels need SM >= 8.0, this GPU is SM {major}.{minor}"
    return "semi-structured", "torch.sparse.to_sparse_semi_structured (cuSPARSELt / CUTLASS)"


def check_24(weight: torch.Tensor, where: str) -> None:
    """Raise naming ``where`` unless every group of four inputs of ``weight [N, K]`` has <= 2 nonzeros."""
    n, k = weight.shape
    if k % 4:
        raise CheckpointError(f"{where}: {k} inputs are not whole groups of 4, so it cannot be 2:4 sparse")
    nonzero = weight.view(torch.uint8) & 0x7F != 0 if weight.element_size() == 1 else weight != 0
    counts = nonzero.view(n, k // 4, 4).sum(-1)
    bad = (counts > 2).nonzero()
    if len(bad):
        row, group = (int(v) for v in bad[0])
        raise CheckpointError(
            f"{where} is not 2:4 sparse: {len(bad)} groups of 4 inputs hold more than 2 nonzeros, first at "
            f"output row {row}, inputs {4 * group}..{4 * group + 3} ({int(counts[row, group])} nonzeros)"
        )


def prune_24(weight: torch.Tensor) -> torch.Tensor:
    """Keep the two largest |w| of each group of four inputs (ties: the earlier input); zero the rest."""
    n, k = weight.shape
    if k % 4:
        raise QuantizationError(
            f"sparsity='2:4' needs layers whose inputs are a multiple of 4, this one has {k}"
        )
    groups = weight.reshape(n, k // 4, 4)
    keep = groups.float().abs().topk(2, dim=-1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
    return (groups * mask).reshape(n, k)


def decompress_bitmask(values: torch.Tensor, bitmask: torch.Tensor, k: int, where: str) -> torch.Tensor:
    """``compressed [N, K/2]`` + ``bitmask [N, ceil(K/8)]`` -> the dense ``[N, K]`` weight."""
    n = values.shape[0]
    if bitmask.dtype != torch.uint8 or tuple(bitmask.shape) != (n, -(-k // 8)):
        raise CheckpointError(
            f"{where}.bitmask: {bitmask.dtype} {tuple(bitmask.shape)}, expected uint8 {(n, -(-k // 8))}"
        )
    if k % 4 or tuple(values.shape) != (n, k // 2):
        raise CheckpointError(
            f"{where}.compressed: shape {tuple(values.shape)}, expected {(n, k // 2)} (two of every 4 inputs)"
        )
    shifts = torch.arange(8, dtype=torch.uint8, device=bitmask.device)
    mask = ((bitmask[..., None] >> shifts) & 1).reshape(n, -1)[:, :k].bool()
    counts = mask.view(n, k // 4, 4).sum(-1)
    bad = (counts != 2).nonzero()
    if len(bad):
        row, group = (int(v) for v in bad[0])
        raise CheckpointError(
            f"{where}.bitmask is not a 2:4 mask: {len(bad)} groups of 4 inputs do not mark exactly 2, first at "
            f"output row {row}, inputs {4 * group}..{4 * group + 3} ({int(counts[row, group])} marked)"
        )
    flat = values.view(torch.uint8) if values.element_size() == 1 else values
    dense = torch.zeros((n, k), dtype=flat.dtype, device=flat.device)
    dense[mask] = flat.reshape(-1)
    return dense.view(values.dtype)


@dataclass(frozen=True)
class Sparse24Config(QuantizationConfig):
    """Wraps the model's quantization: the layers ``targets`` selects (less ``ignore``) are 2:4 sparse."""

    inner: QuantizationConfig
    format: str  # sparse-24-bitmask | dense | on-the-fly
    targets: tuple[str, ...] = ("Linear",)
    ignore: tuple[str, ...] = ("lm_head",)

    @property
    def method(self) -> str:  # type: ignore[override]
        return self.inner.method

    def is_sparse(self, prefix: str) -> bool:
        if prefix == "lm_head" or prefix.endswith(".lm_head"):
            return False
        if matches(prefix, [p if p.startswith("re:") else f"re:(.*\\.)?{p}$" for p in self.ignore]):
            return False
        return any(
            t == "Linear" or t == prefix or (t.startswith("re:") and matches(prefix, [t]))
            for t in self.targets
        )

    def linear_method(self, prefixes: Sequence[str]) -> LinearMethod:
        inner = self.inner.linear_method(prefixes)
        sparse = [self.is_sparse(p) for p in prefixes]
        if not any(sparse):
            return inner
        if not all(sparse):
            raise QuantizationError(
                f"{', '.join(prefixes)} are merged into one layer but only some are 2:4 sparse"
            )
        if self.format == ON_THE_FLY and not isinstance(inner, DenseMethod) and not _takes_weight(inner):
            inner = DenseMethod()  # GGUF blocks: dequantized, then pruned
        return Sparse24Method(inner, self.format)

    def describe(self) -> dict[str, Any]:
        source = (
            "magnitude pruning on the fly" if self.format == ON_THE_FLY else f"checkpoint ({self.format})"
        )
        return self.inner.describe() | {"sparsity": {"structure": "2:4", "source": source}}


def _takes_weight(method: LinearMethod) -> bool:
    from prefixflow.engine.quantization.online import OnlineMethod

    return isinstance(method, OnlineMethod)


class Sparse24Method(KernelMethod):
    """The inner method's storage and kernel, fed 2:4-checked (decompressed, or pruned) weights."""

    def __init__(self, inner: LinearMethod, fmt: str) -> None:
        super().__init__()
        self.inner, self.format = inner, fmt
        if isinstance(inner, DenseMethod):
            inner.prepack = False  # the 2:4 kernel reads the dense weight after loading
        self.name = f"{inner.name}+2:4"
        self.sparse: torch.Tensor | None = None  # the semi-structured weight, when that kernel runs
        self.choice = "unprepared"
        self.pending: dict[int, dict[str, torch.Tensor]] = {}

    def create_weights(
        self,
        layer: nn.Module,
        in_features: int,
        out_sizes: Sequence[int],
        dtype: torch.dtype,
        prefixes: Sequence[str],
        full_sizes: tuple[int, list[int]] | None = None,
    ) -> None:
        self.inner.create_weights(layer, in_features, out_sizes, dtype, prefixes, full_sizes)
        self.in_features, self.out_sizes, self.dtype = in_features, list(out_sizes), dtype
        self.prefixes, self.full_in, self.full_out = (
            self.inner.prefixes,
            self.inner.full_in,
            self.inner.full_out,
        )
        self.specs = self.inner.specs

    def param_specs(self, in_features: int, out_sizes: Sequence[int], dtype: torch.dtype) -> list[ParamSpec]:
        return self.inner.param_specs(in_features, out_sizes, dtype)

    def checkpoint_layout(self, name: str, shard: int = 0) -> tuple[int | None, int | None, int, int]:
        if self.format == "sparse-24-bitmask" and name in BITMASK_TENSORS and "weight" in self.inner.specs:
            return {"compressed": (0, 1, 1, 2), "bitmask": (0, 1, 1, 8), "shape": (None, None, 1, 1)}[name]
        return self.inner.checkpoint_layout(name, shard)

    def load(self, layer: nn.Module, name: str, tensor: torch.Tensor, shard: int) -> None:
        where = self.where(name, shard)
        if self.format == "sparse-24-bitmask" and name in BITMASK_TENSORS and "weight" in self.inner.specs:
            self._load_bitmask(layer, name, tensor, shard)
            return
        if self.format == ON_THE_FLY:
            from prefixflow.engine.quantization.gguf_blocks import dense_from_gguf

            dense = dense_from_gguf(name, tensor, self.in_features)
            if dense is not None:
                name, tensor = "weight", dense
            if name == "weight" and tensor.dim() == 2 and tensor.dtype.is_floating_point:
                tensor = prune_24(tensor)
        elif name == "weight" and tensor.dim() == 2:
            check_24(tensor, where)
        self.inner.load(layer, name, tensor, shard)

    def _load_bitmask(self, layer: nn.Module, name: str, tensor: torch.Tensor, shard: int) -> None:
        prefix = self.prefixes[shard]
        if name == "shape":
            expected = [self.full_out[shard], self.full_in]
            if tensor.dtype.is_floating_point or tensor.flatten().tolist() != expected:
                raise CheckpointError(f"{prefix}.shape = {tensor.flatten().tolist()}, expected {expected}")
            self.seen.add((name, shard))
            return
        parts = self.pending.setdefault(shard, {})
        if name in parts:
            raise CheckpointError(f"{prefix}.{name} appears twice in the checkpoint")
        parts[name] = tensor
        if len(parts) == 2:
            dense = decompress_bitmask(parts["compressed"], parts["bitmask"], self.in_features, prefix)
            del self.pending[shard]
            self.inner.load(layer, "weight", dense, shard)

    def check_complete(self) -> None:
        for shard, parts in sorted(self.pending.items()):
            other = ({"compressed", "bitmask"} - set(parts)).pop()
            raise CheckpointError(
                f"checkpoint is missing {self.prefixes[shard]}.{other} (its {', '.join(parts)} is there)"
            )
        if self.format == "sparse-24-bitmask" and "weight" in self.inner.specs:
            gaps = [p for i, p in enumerate(self.prefixes) if ("shape", i) not in self.seen]
            if gaps:
                raise CheckpointError(f"checkpoint is missing {', '.join(f'{p}.shape' for p in gaps)}")
        self.inner.check_complete()

    def process_after_loading(self, layer: nn.Module, ctx: KernelContext) -> None:
        self.check_complete()
        if (
            isinstance(self.inner, KernelMethod)
            and self.format != ON_THE_FLY
            and "weight" not in self.inner.specs
        ):
            self._check_packed(
                self.inner.build(layer)
            )  # int codes: the structure is in the dequantized values
        self.inner.process_after_loading(layer, ctx)
        self.choice, why = sparse_kernel(ctx.device, ctx.dtype, isinstance(self.inner, KernelMethod))
        if self.choice == "semi-structured":
            self._to_semi_structured(layer)

    def _check_packed(self, weight: PackedWeight | object) -> None:
        if not isinstance(weight, PackedWeight):
            return
        dense = dequantize(weight)  # [N, K]
        offset = 0
        for prefix, rows in zip(self.prefixes, self.out_sizes):
            check_24(dense[offset : offset + rows], f"{prefix} (its dequantized weight_packed)")
            offset += rows

    def _to_semi_structured(self, layer: nn.Module) -> None:
        from torch.sparse import to_sparse_semi_structured

        weight = buffer(layer, "weight")
        try:
            sparse = to_sparse_semi_structured(weight)
        except (RuntimeError, ValueError) as exc:  # shapes the kernels do not take: this layer stays dense
            self.choice = f"dense ({str(exc).splitlines()[0][:80]})"
            return
        self.sparse = sparse
        delattr(layer, "weight")
        for part in ("packed", "meta"):  # counted in the weight bytes, moved with the layer
            value = getattr(sparse, part, None)
            if isinstance(value, torch.Tensor):
                layer.register_buffer(f"sparse_{part}", value, persistent=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.sparse is not None:
            return nn.functional.linear(x, self.sparse, bias)
        return self.inner.apply(layer, x, bias)

    @property
    def kernel_name(self) -> str:
        inner = self.inner.kernel_name if isinstance(self.inner, KernelMethod) else "dense"
        return "semi-structured" if self.choice == "semi-structured" else inner


def parse_sparsity(sc: Any) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(format, targets, ignore) of a ``sparsity_config``; anything but 2:4 is refused naming what is."""
    if not isinstance(sc, dict):
        raise QuantizationError(
            f"quantization_config.sparsity_config must be a mapping, got {type(sc).__name__}"
        )
    fmt = sc.get("format")
    structure = str(sc.get("sparsity_structure") or "unstructured").lower()
    if fmt not in FORMATS:
        raise QuantizationError(
            f"quantization_config.sparsity_config.format={fmt!r} is not supported; supported: "
            f"{', '.join(FORMATS)} with sparsity_structure '2:4' (marlin-24 and unstructured sparse-bitmask are not)"
        )
    if structure != "2:4":
        raise QuantizationError(
            f"quantization_config.sparsity_config.sparsity_structure={sc.get('sparsity_structure')!r} is not "
            "supported; supported: '2:4' (the structure sparse tensor cores run)"
        )
    targets = tuple(sc.get("targets") or ("Linear",))
    ignore = tuple(sc.get("ignore") or ()) + ("lm_head",)
    return str(fmt), targets, ignore


def with_sparsity(
    quant: QuantizationConfig, qc: dict[str, Any] | None, sparsity: str | None
) -> QuantizationConfig:
    """``quant`` wrapped for the checkpoint's 2:4 sparsity config and / or ``sparsity="2:4"``."""
    if sparsity not in (None, "2:4"):
        raise QuantizationError(f"sparsity={sparsity!r} is not supported; supported: '2:4' (or None)")
    sc = (qc or {}).get("sparsity_config")
    if sc:
        fmt, targets, ignore = parse_sparsity(sc)  # sparsity='2:4' on a 2:4 checkpoint is only a check
        return Sparse24Config(quant, fmt, targets, ignore)
    if sparsity == "2:4":
        if quant.method not in ("none", "gguf", "int8", "int4", "fp8"):
            raise QuantizationError(
                f"sparsity='2:4' prunes full-precision weights; this is a {quant.method} checkpoint "
                "(its quantized weights cannot be pruned exactly): load a full-precision model"
            )
        warnings.warn(ACCURACY_WARNING, UserWarning, stacklevel=2)
        return Sparse24Config(quant, ON_THE_FLY)
    return quant

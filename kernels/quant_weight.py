"""The one packed layout every weight-only quantized format is converted to, and its torch reference.

Why one layout: GPTQ, AWQ, compressed-tensors, GGUF Q4_0/Q4_1/Q8_0 and on-the-fly int4/int8 differ in
how the checkpoint stores bits (packing axis, nibble order, zero offsets), not in the arithmetic.
Loaders repack each into ``PackedWeight`` once; the kernels (Triton on CUDA, torch on CPU) read only
this layout.

Arithmetic, for input row ``k`` (of K) and output column ``n`` (of N), with ``g = g_idx[k]`` (or
``k // group_size`` without ``g_idx``)::

    w[n, k] = (q[k, n] - zero[g, n]) * scales[g, n] + mins[g, n]

``q`` is unsigned (0 .. 2**bits - 1); ``zero`` is ``zeros[g, n]`` or the constant ``default_zero``;
``mins`` is 0 unless given (llama.cpp's Q4_1 stores ``w = d * q + m``). Evaluated in float32 the
result is exact for every supported format (a product of a <= 9-bit integer and a 16-bit scale), so
unpacked weights equal the checkpoint's own dequantization bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_BITS = (4, 8)


@dataclass(frozen=True)
class PackedWeight:
    """Weight-only quantized ``[N, K]`` matrix, packed along K (the input dimension).

    ``qweight`` is int32 ``[ceil(K / (32 // bits)), N]``: row ``r`` holds inputs ``r * pack .. r *
    pack + pack - 1``, input ``k`` in bits ``(k % pack) * bits`` upwards. ``scales``, ``zeros`` and
    ``mins`` are ``[num_groups, N]`` in a float dtype (zeros integer-valued). Tensor parallelism
    splits N (column-parallel) anywhere and K (row-parallel) at multiples of ``pack`` and of
    ``group_size``.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    bits: int
    in_features: int
    group_size: int
    zeros: torch.Tensor | None = None
    default_zero: int = -1  # -1: 2 ** (bits - 1)
    mins: torch.Tensor | None = None
    g_idx: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.bits not in SUPPORTED_BITS:
            raise ValueError(f"PackedWeight.bits={self.bits}; supported: {SUPPORTED_BITS}")
        if self.default_zero < 0:
            object.__setattr__(self, "default_zero", 1 << (self.bits - 1))
        rows = -(-self.in_features // self.pack)
        if self.qweight.dtype != torch.int32 or self.qweight.dim() != 2 or self.qweight.shape[0] != rows:
            raise ValueError(
                f"qweight must be int32 [{rows}, N] for K={self.in_features} at {self.bits} bits, "
                f"got {self.qweight.dtype} {tuple(self.qweight.shape)}"
            )
        groups = self.num_groups if self.g_idx is None else None
        for name in ("scales", "zeros", "mins"):
            t = getattr(self, name)
            if t is None:
                continue
            if t.dim() != 2 or t.shape[1] != self.out_features or (groups and t.shape[0] != groups):
                raise ValueError(
                    f"{name} must be [{groups or 'groups'}, {self.out_features}], got {tuple(t.shape)}"
                )
        if self.g_idx is not None and tuple(self.g_idx.shape) != (self.in_features,):
            raise ValueError(f"g_idx must be [{self.in_features}], got {tuple(self.g_idx.shape)}")

    @property
    def pack(self) -> int:
        return 32 // self.bits

    @property
    def out_features(self) -> int:
        return int(self.qweight.shape[1])

    @property
    def num_groups(self) -> int:
        return -(-self.in_features // self.group_size)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors this weight holds (what it costs in memory)."""
        named = {"qweight": self.qweight, "scales": self.scales, "zeros": self.zeros}
        named |= {"mins": self.mins, "g_idx": self.g_idx}
        return {k: v for k, v in named.items() if v is not None}

    def group_index(self) -> torch.Tensor:
        """Group of each input row: ``g_idx`` or ``k // group_size`` (int64 ``[K]``)."""
        if self.g_idx is not None:
            return self.g_idx.long()
        return torch.arange(self.in_features, device=self.qweight.device) // self.group_size


def pack_along_rows(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned ``q [K, N]`` (values < 2**bits) into int32 ``[ceil(K / pack), N]`` (value i at bits i*bits)."""
    pack = 32 // bits
    k, n = q.shape
    rows = -(-k // pack)
    padded = torch.zeros(rows * pack, n, dtype=torch.int32, device=q.device)
    padded[:k] = q
    lanes = padded.view(rows, pack, n)
    words = lanes[:, 0].clone()
    for i in range(1, pack):  # int32 shifts wrap into the sign bit: the bit pattern is what counts
        words |= lanes[:, i] << (bits * i)
    return words


def unpack_rows(qweight: torch.Tensor, bits: int, rows: int) -> torch.Tensor:
    """Inverse of ``pack_along_rows``: int32 ``[ceil(K / pack), N]`` -> int32 ``[rows, N]``."""
    pack = 32 // bits
    shifts = torch.arange(pack, device=qweight.device, dtype=torch.int32) * bits
    q = (qweight[:, None, :] >> shifts[None, :, None]) & ((1 << bits) - 1)
    return q.reshape(-1, qweight.shape[1])[:rows]


def dequantize(w: PackedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dense ``[N, K]`` weight, evaluated in float32 (exact), returned in ``dtype``."""
    q = unpack_rows(w.qweight, w.bits, w.in_features).float()  # [K, N]
    groups = w.group_index()
    zero: torch.Tensor | float = w.zeros.float()[groups] if w.zeros is not None else float(w.default_zero)
    dense = (q - zero) * w.scales.float()[groups]
    if w.mins is not None:
        dense = dense + w.mins.float()[groups]
    return dense.t().contiguous().to(dtype)


def quant_linear_reference(
    x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ dequantize(w).T + bias`` in float32, returned in ``x.dtype``: the oracle for every kernel."""
    out = x.float() @ dequantize(w).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)

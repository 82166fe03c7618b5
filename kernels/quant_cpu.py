"""Weight-only quantized matmuls from plain torch ops: the CPU path (and a CUDA path without Triton).

Three implementations of ``x @ dequantize(w).T`` (``w`` a ``PackedWeight``), each repacking once:
- ``DequantChunks``: unpack a few hundred output rows at a time and multiply, in float32 (the
  weights are the checkpoint's dequantization bit for bit; only the summation order differs);
- ``Int8Pack``: ``torch._weight_int8pack_mm`` (per-channel int8, bfloat16/float16 activations);
- ``Int4Pack``: ``torch._weight_int4pack_mm_for_cpu`` (group-wise int4, bfloat16/float16).

``select_cpu_kernel`` picks by measurement (benchmarks/quant_cpu_paths.py, RESULTS.md "Quantized
weights on the CPU"): torch's pack ops have no fast float32 path (5-50x slower than a dense float32
matmul there), so float32 activations take ``DequantChunks``; bfloat16/float16 take the pack op
where the layout allows one, else ``DequantChunks``. Activations are never rounded below their
dtype.
"""

from __future__ import annotations

import torch

from prefixflow.kernels.quant_weight import PackedWeight, unpack_rows

_CHUNK_BYTES = 1 << 20  # float32 bytes dequantized per step of DequantChunks: about L2-sized
INT4_GROUPS = (32, 64, 128, 256)  # group sizes torch's CPU int4 kernel takes


class _RowMajor:
    """``w`` as unsigned codes ``[N, K_pad]`` (act-order undone, K padded to whole groups) + group params ``[N, G]``."""

    def __init__(self, w: PackedWeight) -> None:
        q = unpack_rows(w.qweight, w.bits, w.in_features)  # [K, N]
        groups = w.group_index()
        self.perm: torch.Tensor | None = None
        group = w.group_size
        if w.g_idx is not None:
            counts = torch.bincount(groups, minlength=int(groups.max()) + 1)
            if counts.numel() == 1:
                group = w.in_features
            elif bool((counts[:-1] == counts[0]).all()) and int(counts[-1]) <= int(counts[0]):
                perm = torch.argsort(groups, stable=True)
                if not torch.equal(perm, torch.arange(w.in_features, device=perm.device)):
                    self.perm = perm
                    q = q[perm]
                group = int(counts[0])
            else:
                raise ValueError(
                    "g_idx whose groups differ in size cannot be reordered into contiguous groups"
                )  # noqa: E501
        self.group = group
        self.num_groups = -(-w.in_features // group)
        self.k = w.in_features
        self.k_pad = self.num_groups * group
        rows = torch.zeros(self.k_pad, q.shape[1], dtype=torch.int32, device=q.device)
        rows[: self.k] = q
        self.codes = rows.t().contiguous()  # [N, K_pad]
        ng = self.num_groups
        first = torch.arange(ng, device=q.device) * group  # the group of row first[g] is g after reordering
        pick = groups[self.perm[first]] if self.perm is not None else groups[first]
        self.scales = w.scales.float()[pick].t().contiguous()  # [N, G]
        self.default_zero = w.default_zero
        self.zeros = None if w.zeros is None else w.zeros.float()[pick].t().contiguous()
        self.mins = None if w.mins is None else w.mins.float()[pick].t().contiguous()


def _prepare_x(x: torch.Tensor, perm: torch.Tensor | None, k_pad: int) -> torch.Tensor:
    if perm is not None:
        x = x.index_select(-1, perm)
    if x.shape[-1] < k_pad:
        x = torch.nn.functional.pad(x, (0, k_pad - x.shape[-1]))
    return x


class DequantChunks:
    """Dequantize a few hundred output rows at a time in float32 and multiply (any layout, any dtype).

    Codes are bytes: 4-bit ones two per byte as planes (byte ``j`` of a group holds input ``j`` in its
    low nibble and ``j + group / 2`` in its high nibble, llama.cpp's block order), so unpacking is one
    byte op per plane. ``(q - z) * s + m = q * s + (m - z * s)``: the per-chunk work is ``q * s`` (exact
    in float32) and one matmul per plane; the constant part is one small matmul of per-group sums of
    ``x``. Results are in ``x.dtype``; arithmetic in float32.
    """

    name = "cpu-dequant"

    def __init__(self, w: PackedWeight, dtype: torch.dtype) -> None:
        r = _RowMajor(w)
        self.group, self.k, self.k_pad, self.perm, self.num_groups = (
            r.group,
            r.k,
            r.k_pad,
            r.perm,
            r.num_groups,
        )
        n = r.codes.shape[0]
        codes = r.codes.view(n, r.num_groups, r.group)
        self.planes = w.bits == 4 and r.group % 2 == 0
        if self.planes:
            half = r.group // 2
            self.codes = (codes[..., :half] | (codes[..., half:] << 4)).to(torch.uint8)  # [N, G, group/2]
        else:
            self.codes = codes.to(torch.uint8)  # [N, G, group]
        self.scales = r.scales[:, :, None].contiguous()  # [N, G, 1] float32
        zero = r.zeros if r.zeros is not None else torch.full_like(r.scales, r.default_zero)
        shift = (r.mins if r.mins is not None else 0.0) - zero * r.scales
        self.shift = shift.t().contiguous()  # [G, N]
        self.n = n
        self.rows = max(16, min(n, _CHUNK_BYTES // (r.k_pad * 4)))

    def tensors(self) -> dict[str, torch.Tensor]:
        named = {"codes": self.codes, "scales": self.scales, "shift": self.shift, "perm": self.perm}
        return {k: v for k, v in named.items() if v is not None}

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2 = _prepare_x(x.reshape(-1, x.shape[-1]).float(), self.perm, self.k_pad)
        m = x2.shape[0]
        out = torch.empty(m, self.n, dtype=torch.float32, device=x.device)
        grouped = x2.view(m, self.num_groups, self.group)
        if self.planes:
            half = self.group // 2
            x_lo = grouped[..., :half].reshape(m, -1)
            x_hi = grouped[..., half:].reshape(m, -1)
        for start in range(0, self.n, self.rows):
            stop = min(self.n, start + self.rows)
            codes, scales, part = self.codes[start:stop], self.scales[start:stop], out[:, start:stop]
            if self.planes:
                torch.mm(x_lo, torch.mul(codes & 15, scales).view(stop - start, -1).t(), out=part)
                part.addmm_(x_hi, torch.mul(codes >> 4, scales).view(stop - start, -1).t())
            else:
                torch.mm(x2, torch.mul(codes, scales).view(stop - start, -1).t(), out=part)
        out.addmm_(grouped.sum(-1), self.shift)
        if bias is not None:
            out += bias.float()
        return out.to(x.dtype).reshape(*x.shape[:-1], self.n)


class GatherChunks:
    """Like ``DequantChunks`` for any ``g_idx``: each chunk gathers its per-input scales through it.

    Needed where groups cannot be made contiguous, e.g. one tensor-parallel rank of an act-order
    layer, whose inputs draw unevenly on the groups. 4-bit codes are two per byte (even and odd
    inputs).
    """

    name = "cpu-dequant-gather"

    def __init__(self, w: PackedWeight, dtype: torch.dtype) -> None:
        q = unpack_rows(w.qweight, w.bits, w.in_features).t()  # [N, K]
        groups = w.group_index()
        self.planes = w.bits == 4 and w.in_features % 2 == 0
        if self.planes:
            self.codes = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8).contiguous()
            self.g_lo, self.g_hi = groups[0::2].contiguous(), groups[1::2].contiguous()
        else:
            self.codes = q.to(torch.uint8).contiguous()
            self.g_lo = self.g_hi = groups
        self.scales = w.scales.float().t().contiguous()  # [N, G]
        zero = w.zeros.float().t() if w.zeros is not None else torch.full_like(self.scales, w.default_zero)
        mins = w.mins.float().t() if w.mins is not None else 0.0
        self.shift = (mins - zero * self.scales).contiguous()  # w = q * s + shift
        self.n = self.codes.shape[0]
        self.rows = max(16, min(self.n, _CHUNK_BYTES // (w.in_features * 4)))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            "codes": self.codes,
            "scales": self.scales,
            "shift": self.shift,
            "g_lo": self.g_lo,
            "g_hi": self.g_hi,
        }

    def _dense(self, codes: torch.Tensor, start: int, stop: int, g: torch.Tensor) -> torch.Tensor:
        return codes * self.scales[start:stop].index_select(1, g) + self.shift[start:stop].index_select(1, g)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).float()
        out = torch.empty(x2.shape[0], self.n, dtype=torch.float32, device=x.device)
        for start in range(0, self.n, self.rows):
            stop = min(self.n, start + self.rows)
            codes, part = self.codes[start:stop], out[:, start:stop]
            if self.planes:
                torch.mm(x2[:, 0::2], self._dense(codes & 15, start, stop, self.g_lo).t(), out=part)
                part.addmm_(x2[:, 1::2], self._dense(codes >> 4, start, stop, self.g_hi).t())
            else:
                torch.mm(x2, self._dense(codes, start, stop, self.g_lo).t(), out=part)
        if bias is not None:
            out += bias.float()
        return out.to(x.dtype).reshape(*x.shape[:-1], self.n)


class Int8Pack:
    """``torch._weight_int8pack_mm`` on ``(q - 128)`` with per-channel scales; asymmetric zeros and
    mins become one rank-1 correction ``rowsum(x) * ((128 - z) * s + m)``."""

    name = "cpu-int8pack"

    def __init__(self, w: PackedWeight, dtype: torch.dtype) -> None:
        r = _RowMajor(w)
        assert w.bits == 8 and r.num_groups == 1 and r.perm is None
        self.k_pad = -(-r.k // 16) * 16  # the op needs K % 16 == 0 (other K crash in torch 2.13)
        weight = torch.zeros(r.codes.shape[0], self.k_pad, dtype=torch.int8)
        weight[:, : r.k] = r.codes[:, : r.k] - 128
        self.weight = weight  # [N, K_pad]
        s = r.scales[:, 0]
        self.scales = s.to(dtype)
        zero = r.zeros[:, 0] if r.zeros is not None else torch.full_like(s, r.default_zero)
        shift = (128 - zero) * s + (r.mins[:, 0] if r.mins is not None else 0.0)
        self.shift = None if bool((shift == 0).all()) else shift.to(dtype)

    def tensors(self) -> dict[str, torch.Tensor]:
        named = {"weight": self.weight, "scales": self.scales, "shift": self.shift}
        return {k: v for k, v in named.items() if v is not None}

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        out = torch._weight_int8pack_mm(
            _prepare_x(x2, None, self.k_pad).contiguous(), self.weight, self.scales
        )
        if self.shift is not None:
            out += x2.float().sum(-1, keepdim=True).to(x.dtype) * self.shift
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


class Int4Pack:
    """``torch._weight_int4pack_mm_for_cpu``: w = (q - 8) * s + zf, so zf = (8 - z) * s + m per group."""

    name = "cpu-int4pack"

    def __init__(self, w: PackedWeight, dtype: torch.dtype) -> None:
        r = _RowMajor(w)
        assert w.bits == 4 and r.group in INT4_GROUPS and r.codes.shape[0] % 16 == 0
        self.group, self.k_pad, self.perm = r.group, r.k_pad, r.perm
        self.weight = torch._convert_weight_to_int4pack_for_cpu(r.codes, 1)
        zero = r.zeros if r.zeros is not None else torch.full_like(r.scales, r.default_zero)
        zf = (8 - zero) * r.scales + (r.mins if r.mins is not None else 0.0)
        self.scale_zeros = torch.stack([r.scales.t(), zf.t()], -1).to(dtype).contiguous()  # [G, N, 2]

    def tensors(self) -> dict[str, torch.Tensor]:
        named = {"weight": self.weight, "scale_zeros": self.scale_zeros, "perm": self.perm}
        return {k: v for k, v in named.items() if v is not None}

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2 = _prepare_x(x.reshape(-1, x.shape[-1]), self.perm, self.k_pad).contiguous()
        out = torch._weight_int4pack_mm_for_cpu(x2, self.weight, self.group, self.scale_zeros)
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


CpuKernel = DequantChunks | GatherChunks | Int8Pack | Int4Pack


def select_cpu_kernel(w: PackedWeight, dtype: torch.dtype, prefer: str = "auto") -> CpuKernel:
    """The measured-fastest exact-in-its-dtype kernel for ``w`` and activations of ``dtype``.

    ``prefer``: "auto", or "dequant" to force ``DequantChunks`` (benchmarks compare the paths).
    """
    if prefer not in ("auto", "dequant"):
        raise ValueError(f"prefer={prefer!r}; expected 'auto' or 'dequant'")
    if prefer == "auto" and dtype in (torch.bfloat16, torch.float16):
        if w.bits == 8 and w.num_groups == 1 or (w.bits == 8 and _one_group(w)):
            return Int8Pack(w, dtype)
        if w.bits == 4 and w.out_features % 16 == 0:
            try:
                return Int4Pack(w, dtype)
            except (AssertionError, ValueError):
                pass
    try:
        return DequantChunks(w, dtype)
    except ValueError:  # groups of unequal size: gather scales per input instead
        return GatherChunks(w, dtype)


def _one_group(w: PackedWeight) -> bool:
    return w.g_idx is not None and int(w.g_idx.max()) == 0

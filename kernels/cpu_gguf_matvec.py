"""GGUF Q8_0/Q4_0/Q4_1 blocks times a few float32 rows on the CPU, the blocks read as they lie
(kernels/native/gguf_matvec.c).

Why: a decode of a few rows streams every weight for two flops each, and dense float32 weights are
4 bytes a weight against 0.56-1.06 in the blocks. torch's int4 pack op takes bf16 or float16 rows fast,
but float32 rows ran 5.7x slower than the dense matmul on AVX2, so the float32 CPU path (every CPU
without native bf16) had no packed option for decodes (benchmarks/RESULTS.md issue 24, "Fifteenth round").

``matvec`` returns None where the call does not fit (no C compiler, a CPU without AVX2, not float32, a
kind it does not know): the caller keeps its dense path, which is always correct.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from prefixflow.kernels import native_build

KINDS = {"Q8_0": 0, "Q4_0": 1, "Q4_1": 2}
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
BLOCK = 32


@functools.cache
def _built() -> ctypes.CDLL | None:
    """The library with its signature declared, once (native_build caches the build and the load)."""
    lib = native_build.load("gguf_matvec")
    if lib is not None:
        lib.pf_gguf_matvec_simd.restype = ctypes.c_int
        if (
            not lib.pf_gguf_matvec_simd()
        ):  # no AVX2 in this build: the dense matmul is faster than scalar code
            return None
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.pf_gguf_matvec.argtypes = [i32, p, i64, i64, p, i64, i64, p, i64, i32]
        lib.pf_gguf_matvec.restype = ctypes.c_int
    return lib


def available() -> bool:
    """Whether the native library is built and loaded with its AVX2 kernel (x86 since Haswell)."""
    return _built() is not None


def matvec(kind: str, blocks: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
    """``x @ W.T`` for W given as uint8 blocks ``[N, K / 32, block_bytes]`` of ``kind`` and float32 ``x``
    ``[..., K]``; float32 ``[..., N]``, or None where the native kernel cannot take the call."""
    lib = _built()
    if (
        lib is None
        or kind not in KINDS
        or x.dtype != torch.float32
        or x.device.type != "cpu"
        or blocks.dtype != torch.uint8
        or blocks.dim() != 3
        or blocks.shape[2] != BLOCK_BYTES[kind]
        or not blocks.is_contiguous()
        or x.shape[-1] != blocks.shape[1] * BLOCK
    ):
        return None
    k = x.shape[-1]
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    n_out = blocks.shape[0]
    out = torch.empty(rows.shape[0], n_out, dtype=torch.float32)
    if rows.shape[0] == 0:
        return out.view(*x.shape[:-1], n_out)
    code = lib.pf_gguf_matvec(
        KINDS[kind],
        blocks.data_ptr(),
        n_out,
        k,
        rows.data_ptr(),
        rows.stride(0),
        rows.shape[0],
        out.data_ptr(),
        n_out,
        torch.get_num_threads(),
    )
    if code:
        raise RuntimeError(f"native gguf_matvec failed with code {code}")
    return out.view(*x.shape[:-1], n_out)


def q8_0_blocks(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` (float32 ``[N, K]``) as Q8_0 blocks ``[N, K / 32, 34]`` if it is exactly a Q8_0
    tensor's dequantization, else None.

    Why: a GGUF file's tied embedding arrives dequantized (the lookup wants rows), but as the LM head it
    is read whole at every decode. llama.cpp's Q8_0 sets a block's scale to its largest magnitude / 127
    (rounded to float16), so that scale and the codes are recovered exactly; the result is accepted only
    if it dequantizes back to ``weight`` bit for bit, so any other encoding keeps the dense head."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] % BLOCK or weight.numel() == 0:
        return None
    n, k = weight.shape
    w = weight.detach().reshape(n, k // BLOCK, BLOCK)
    d = w.abs().amax(dim=-1) / 127.0
    d16 = d.to(torch.float16)
    d32 = d16.float()
    codes = (w / torch.where(d32 == 0, torch.ones_like(d32), d32).unsqueeze(-1)).round_()
    if not torch.equal(d32.unsqueeze(-1) * codes, w) or bool((codes.abs() > 127).any()):
        return None
    raw = torch.empty(n, k // BLOCK, BLOCK_BYTES["Q8_0"], dtype=torch.uint8)
    raw[..., :2] = d16.contiguous().view(torch.uint8).view(n, k // BLOCK, 2)
    raw[..., 2:] = codes.to(torch.int8).view(torch.uint8)
    return raw

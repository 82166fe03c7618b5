"""Choose the kernel implementation for a device: Triton on CUDA, the torch reference elsewhere.

Triton is imported only when a Triton backend is actually chosen, so `from prefixflow import kernels` works on a
machine without triton. Forcing "triton" on a CPU device is allowed only under the Triton
interpreter (TRITON_INTERPRET=1 set before the kernel modules are first imported), which is how the
CPU tests exercise the kernels.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

BACKEND_ENV = "PREFIXFLOW_KERNELS"  # optional override of name="auto": "torch" or "triton"


@dataclass(frozen=True)
class KernelBackend:
    """The five kernels of docs/contracts.md, all from one implementation."""

    name: str
    store_kv: Callable[..., None]
    paged_attention: Callable[..., torch.Tensor]
    rms_norm: Callable[..., torch.Tensor | tuple[torch.Tensor, torch.Tensor]]
    rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_and_mul: Callable[..., torch.Tensor]


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _torch_backend() -> KernelBackend:
    """The torch kernels: attention is the native row kernel where it is built and faster, else the
    batched SDPA path (kernels/cpu_row_attention.py); norm, rotary and activation one native call on
    bf16 rows (kernels/cpu_native_ops.py), else the fewer-pass versions (kernels/cpu_ops.py); the KV
    store one native byte copy per token where the dtypes agree, else the reference's;
    ``kernels/reference.py`` stays the test oracle of all of them."""
    from prefixflow.kernels import cpu_native_ops, cpu_row_attention

    return KernelBackend(
        "torch",
        cpu_native_ops.store_kv,
        cpu_row_attention.paged_attention,
        cpu_native_ops.rms_norm,
        cpu_native_ops.rotary,
        cpu_native_ops.silu_and_mul,
    )


def _triton_backend(device: torch.device) -> KernelBackend:
    if not triton_available():
        raise RuntimeError("kernel backend 'triton' requested but triton is not installed")
    from prefixflow.kernels import (
        triton_activation,
        triton_attention,
        triton_norm,
        triton_rotary,
        triton_store_kv,
    )

    if device.type != "cuda" and not triton_attention.INTERPRETED:
        raise RuntimeError(
            f"kernel backend 'triton' on device {device} needs TRITON_INTERPRET=1 set before the "
            "kernels.triton_* modules are imported (or a CUDA device)"
        )
    return KernelBackend(
        "triton",
        triton_store_kv.store_kv,
        triton_attention.paged_attention,
        triton_norm.rms_norm,
        triton_rotary.rotary,
        triton_activation.silu_and_mul,
    )


def select(name: str = "auto", device: torch.device | str | None = None) -> KernelBackend:
    """name: "auto" (Triton on CUDA when installed, else torch), "torch" or "triton".

    With name="auto" the environment variable PREFIXFLOW_KERNELS, if set, forces the choice.
    device defaults to CUDA when available, else CPU.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if name == "auto":
        name = os.environ.get(BACKEND_ENV, "").strip().lower() or "auto"
    if name == "auto":
        name = "triton" if device.type == "cuda" and triton_available() else "torch"
    if name == "torch":
        return _torch_backend()
    if name == "triton":
        return _triton_backend(device)
    raise ValueError(f"unknown kernel backend {name!r}: expected 'auto', 'torch' or 'triton'")


def batch_invariant(ops: KernelBackend) -> KernelBackend:
    """``ops`` with paged attention whose per-row results do not depend on the rest of the step
    (kernels/invariant_attention.py). Only the torch kernels have it: the Triton kernels' tile shapes
    depend on the batch, and a GPU needs batch-invariant kernels of its own."""
    if ops.name != "torch":
        raise ValueError(
            f"batch_invariant=True runs on the torch (CPU) kernels only, not on {ops.name!r}; "
            "set kernel_backend='torch' on a CPU device, or turn batch_invariant off"
        )
    from prefixflow.kernels.cpu_row_attention import paged_attention_invariant

    return dataclasses.replace(ops, name="torch-invariant", paged_attention=paged_attention_invariant)

"""What the loaded weights cost and how each linear layer runs: for ``llm.stats()`` and ``describe_model``."""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from prefixflow.engine.quantization.method import DenseMethod, KernelMethod


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer the model holds (each storage counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (
            (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            if t.device.type != "meta"
            else (id(t), 0)
        )
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    for module in model.modules():  # prepacked weights are held by the method (or model), not as buffers
        method = getattr(module, "method", None)
        for held in (getattr(method, "prepacked", None), getattr(method, "int8", None)):
            total += held.nbytes if held is not None else 0
        head = getattr(module, "int8_head", None)
        total += head.nbytes if head is not None else 0
    return total


def linear_kernels(model: nn.Module) -> dict[str, int]:
    """How many linear layers run each ``method/kernel`` (``dense`` for full-precision ones)."""
    counts: Counter[str] = Counter()
    for module in model.modules():
        method = getattr(module, "method", None)
        if isinstance(method, KernelMethod):
            counts[f"{method.name}/{method.kernel_name}"] += 1
        elif isinstance(method, DenseMethod) and (method.prepacked is not None or method.int8 is not None):
            counts[f"{method.name}/{method.kernel_name}"] += 1
        elif method is not None:
            counts[str(getattr(method, "name", "dense"))] += 1
    return dict(sorted(counts.items()))


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()

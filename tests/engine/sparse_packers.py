"""Test-side writer of compressed-tensors 2:4 sparse checkpoints, from the format description
(engine/quantization/sparse24.py docstring, docs/models.md "2:4 sparsity"), independent of the engine.

``write_sparse(base, root, SparseFmt(...))`` prunes every decoder projection of a full-precision HF
directory to 2:4 by magnitude (numpy: the two largest |w| of each group of four inputs), optionally
quantizes it (FP8 per channel, or int4 pack-quantized, through tests/engine/quant_packers.py), stores it
bitmask-compressed or dense, and writes a dense twin for transformers. Bit packing uses
``numpy.packbits(bitorder="little")``; the engine unpacks with torch shifts.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from tests.engine.quant_packers import PROJ, Fmt, quantization_config, quantize_tensor


@dataclass(frozen=True)
class SparseFmt:
    storage: str  # "sparse-24-bitmask" | "dense"
    quant: str | None = None  # None | "fp8" | "int4"

    @property
    def label(self) -> str:
        return f"sparse24-{self.storage}-{self.quant or 'w16'}"

    @property
    def quant_fmt(self) -> Fmt | None:
        return {
            None: None,
            "fp8": Fmt("ct-fp8", fp8_strategy="channel"),
            "int4": Fmt("ct-int", 4, 128, sym=True),
        }[self.quant]


def prune_mask(w: np.ndarray) -> np.ndarray:
    """Boolean [N, K]: the two largest |w| of each group of four inputs."""
    n, k = w.shape
    order = np.argsort(-np.abs(w.reshape(n, k // 4, 4)), axis=-1, kind="stable")
    mask = np.zeros((n, k // 4, 4), bool)
    np.put_along_axis(mask, order[..., :2], True, axis=-1)
    return mask.reshape(n, k)


def pack_bitmask(values: torch.Tensor, mask: np.ndarray) -> dict[str, torch.Tensor]:
    """``compressed`` [N, K/2] (kept values row by row), ``bitmask`` uint8 [N, ceil(K/8)], ``shape`` [2, 1]."""
    n, k = mask.shape
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[values.element_size()]  # numpy has no bf16 / e4m3
    kept = values.contiguous().view(bits).numpy()[mask].reshape(n, k // 2)
    compressed = torch.from_numpy(np.ascontiguousarray(kept)).view(values.dtype)
    bitmask = torch.from_numpy(np.packbits(mask, axis=-1, bitorder="little"))
    return {
        "compressed": compressed,
        "bitmask": bitmask,
        "shape": torch.tensor([[n], [k]], dtype=torch.int64),
    }


def sparsity_qc(fmt: SparseFmt) -> dict:
    sc = {
        "format": fmt.storage,
        "sparsity_structure": "2:4",
        "targets": ["Linear"],
        "ignore": ["lm_head"],
        "global_sparsity": 0.5,
        "registry_requires_subclass": False,
    }
    qf = fmt.quant_fmt
    if qf is None:
        return {"quant_method": "compressed-tensors", "format": fmt.storage, "sparsity_config": sc}
    return quantization_config(qf) | {"sparsity_config": sc}


def sparsify_tensor(w: torch.Tensor, fmt: SparseFmt) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One projection -> (checkpoint tensors by suffix, the dense weight the engine must compute with)."""
    mask = prune_mask(w.float().numpy())
    pruned = w.float() * torch.from_numpy(mask)
    qf = fmt.quant_fmt
    if qf is None:
        parts, dense = {"weight": pruned}, pruned
    else:
        parts, dense = quantize_tensor(pruned, qf, None)
    if (
        fmt.storage == "sparse-24-bitmask" and "weight" in parts
    ):  # int codes stay packed (as compressed-tensors does)
        parts = {k: v for k, v in parts.items() if k != "weight"} | pack_bitmask(parts["weight"], mask)
    return parts, dense


def write_sparse(base: Path, root: Path, fmt: SparseFmt, corrupt: str | None = None) -> tuple[Path, Path]:
    """(sparse checkpoint dir, dense twin dir). ``corrupt``: a projection weight name given a third nonzero."""
    out_dir, twin_dir = root / f"{base.name}-{fmt.label}", root / f"{base.name}-{fmt.label}-twin"
    tensors = load_file(str(base / "model.safetensors"))
    packed: dict[str, torch.Tensor] = {}
    twin: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in PROJ:
            if name == corrupt:
                parts, dense = _with_third_nonzero(t, fmt)
            else:
                parts, dense = sparsify_tensor(t, fmt)
            packed |= {f"{module}.{suffix}": v.contiguous() for suffix, v in parts.items()}
            twin[name] = dense
        else:
            packed[name] = twin[name] = t.float().contiguous()
    for out, weights, qc in ((out_dir, packed, sparsity_qc(fmt)), (twin_dir, twin, None)):
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(base, out, ignore=shutil.ignore_patterns("*.safetensors"))
        save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
        cfg = json.loads((out / "config.json").read_text())
        cfg.pop("quantization_config", None)
        if qc is not None:
            cfg["quantization_config"] = qc
        (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out_dir, twin_dir


def _with_third_nonzero(w: torch.Tensor, fmt: SparseFmt) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A bad mask: row 1, inputs 4..7 keep three values (the bitmask marks three of them)."""
    mask = prune_mask(w.float().numpy())
    mask[1, 4:7] = True
    mask[1, 7] = False
    values = w.float() * torch.from_numpy(mask)
    if fmt.storage == "dense":
        return {"weight": values}, values
    n, k = mask.shape  # three marks in one group and one in the next keeps the count at K/2 for the row
    mask[1, 8:12] = False
    mask[1, 8] = True
    return pack_bitmask(w.float() * torch.from_numpy(mask), mask), values

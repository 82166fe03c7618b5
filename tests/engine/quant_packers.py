"""Test-side writers of quantized checkpoints, written from the format descriptions (docs/models.md,
ARCHITECTURE.md "Quantized checkpoint formats"), independent of the engine's unpackers.

``write_quantized(base_dir, out_root, fmt)`` quantizes every decoder projection of a full-precision HF
directory by round-to-nearest and writes two directories:
- the quantized checkpoint (``config.json`` with ``quantization_config``, packed safetensors);
- its dense twin: the same model with the packer's dequantized weights in float32, which
  transformers loads as an ordinary model.
It also returns the dequantized tensors by name, the oracle of the exactness tests.
Bit packing here uses numpy uint32 shifts; the engine uses torch, so the two are independent.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_NIBBLE_COLUMN = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column 8j + this


@dataclass(frozen=True)
class Fmt:
    """One checkpoint variant. kind: gptq | awq | ct-int | ct-fp8."""

    kind: str
    bits: int = 4
    group: int = 128  # -1: one group per output column
    sym: bool = True
    act_order: bool = False
    v2: bool = False  # GPTQ checkpoint_format gptq_v2 (zeros stored as is)
    fp8_strategy: str = "channel"

    @property
    def label(self) -> str:
        parts = [self.kind, f"w{self.bits}", f"g{self.group}", "sym" if self.sym else "asym"]
        parts += ["actorder"] if self.act_order else []
        parts += ["v2"] if self.v2 else []
        return "-".join(parts) if self.kind != "ct-fp8" else f"ct-fp8-{self.fp8_strategy}"


def _pack_u32(values: np.ndarray, bits: int, axis: int, order: tuple[int, ...] | None = None) -> np.ndarray:
    """Pack unsigned values along ``axis`` (zero-padded to whole words); value i of a word at bits i*bits."""
    per = 32 // bits
    v = np.moveaxis(values.astype(np.uint32), axis, -1)
    pad = (-v.shape[-1]) % per
    v = np.concatenate([v, np.zeros((*v.shape[:-1], pad), np.uint32)], -1) if pad else v
    v = v.reshape(*v.shape[:-1], -1, per)
    word = np.zeros(v.shape[:-1], np.uint32)
    for i in range(per):
        column = order[i] if order else i
        word |= v[..., column] << np.uint32(bits * i)
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(word.view(np.int32), -1, axis)))


def _groups(k: int, group: int, perm: np.ndarray | None) -> np.ndarray:
    """Group of each input column; with act-order, groups are runs of the permuted order."""
    size = k if group == -1 else group
    if perm is None:
        return np.arange(k) // size
    g = np.empty(k, np.int64)
    g[perm] = np.arange(k) // size
    return g


def _rtn(
    w: np.ndarray, g_of_k: np.ndarray, bits: int, sym: bool, min_zero: int, scale_dtype: torch.dtype
) -> tuple:
    """Round-to-nearest codes [N, K], scales exact in ``scale_dtype`` and integer zeros [N, G]."""
    maxq = 2**bits - 1
    n_groups = int(g_of_k.max()) + 1
    scales = np.zeros((w.shape[0], n_groups), np.float32)
    zeros = np.zeros((w.shape[0], n_groups), np.float32)
    for g in range(n_groups):
        cols = w[:, g_of_k == g]
        if sym:
            s = np.abs(cols).max(1) / (maxq / 2)
            z = np.full(w.shape[0], (maxq + 1) / 2)
        else:
            lo, hi = np.minimum(cols.min(1), 0), np.maximum(cols.max(1), 0)
            s = (hi - lo) / maxq
        s = torch.from_numpy(np.maximum(s, 1e-6).astype(np.float32)).to(scale_dtype).float().numpy()
        if not sym:
            z = np.clip(np.round(-lo / s), min_zero, maxq)
        scales[:, g], zeros[:, g] = s, z
    q = np.clip(np.round(w / scales[:, g_of_k]) + zeros[:, g_of_k], 0, maxq)
    return q.astype(np.int64), scales, zeros


def _dequant(q: np.ndarray, scales: np.ndarray, zeros: np.ndarray, g_of_k: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(
        ((q - zeros[:, g_of_k]).astype(np.float32) * scales[:, g_of_k]).astype(np.float32)
    )


def quantize_tensor(
    w: torch.Tensor, fmt: Fmt, perm: np.ndarray | None
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One projection -> (checkpoint tensors by suffix, dequantized float32 weight)."""
    wn = w.float().numpy()
    n, k = wn.shape
    if fmt.kind == "ct-fp8":
        if fmt.fp8_strategy == "tensor":
            scale = torch.tensor([float(np.abs(wn).max()) / 448.0], dtype=torch.float32)
            wq = (w.float() / scale).to(torch.float8_e4m3fn)
            return {"weight": wq, "weight_scale": scale}, wq.float() * scale
        scale = torch.from_numpy(np.abs(wn).max(1, keepdims=True) / 448.0).float()
        wq = (w.float() / scale).to(torch.float8_e4m3fn)
        return {"weight": wq, "weight_scale": scale}, wq.float() * scale
    g_of_k = _groups(k, fmt.group, perm)
    min_zero = (
        1 if fmt.kind == "gptq" and not fmt.v2 else 0
    )  # v1 stores zero - 1: a zero of 0 cannot be stored
    scale_dtype = torch.bfloat16 if fmt.kind == "ct-int" else torch.float16
    q, scales, zeros = _rtn(wn, g_of_k, fmt.bits, fmt.sym, min_zero, scale_dtype)
    dense = _dequant(q, scales, zeros, g_of_k)
    mask = 2**fmt.bits - 1
    if fmt.kind == "gptq":
        stored_zero = (zeros.astype(np.int64) - (0 if fmt.v2 else 1)) & mask
        tensors = {
            "qweight": _pack_u32(q.T, fmt.bits, axis=0),  # [K/pack, N]
            "qzeros": _pack_u32(stored_zero.T, fmt.bits, axis=1),  # [G, N/pack]
            "scales": torch.from_numpy(scales.T.copy()).half(),
            "g_idx": torch.from_numpy(g_of_k.astype(np.int32)),
        }
    elif fmt.kind == "awq":
        tensors = {
            "qweight": _pack_u32(q.T, 4, axis=1, order=AWQ_NIBBLE_COLUMN),  # [K, N/8]
            "qzeros": _pack_u32(zeros.T.astype(np.int64), 4, axis=1, order=AWQ_NIBBLE_COLUMN),
            "scales": torch.from_numpy(scales.T.copy()).half(),
        }
    else:  # compressed-tensors pack-quantized: signed values stored with a 2**(bits-1) offset
        tensors = {
            "weight_packed": _pack_u32(q, fmt.bits, axis=1),  # q already = signed + offset
            "weight_scale": torch.from_numpy(scales.copy()).to(torch.bfloat16),  # [N, G]
            "weight_shape": torch.tensor([n, k], dtype=torch.int64),
        }
        if not fmt.sym:
            tensors["weight_zero_point"] = _pack_u32(zeros.astype(np.int64), fmt.bits, axis=0)  # [N/pack, G]
        if fmt.act_order:
            tensors["weight_g_idx"] = torch.from_numpy(g_of_k.astype(np.int32))
    return tensors, dense


def quantization_config(fmt: Fmt) -> dict:
    if fmt.kind == "gptq":
        return {
            "quant_method": "gptq",
            "bits": fmt.bits,
            "group_size": fmt.group,
            "desc_act": fmt.act_order,
            "sym": fmt.sym,
            "checkpoint_format": "gptq_v2" if fmt.v2 else "gptq",
            "lm_head": False,
        }
    if fmt.kind == "awq":
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": fmt.group,
            "zero_point": True,
            "version": "gemm",
        }
    if fmt.kind == "ct-fp8":
        weights = {
            "num_bits": 8,
            "type": "float",
            "strategy": fmt.fp8_strategy,
            "symmetric": True,
            "dynamic": False,
        }
        acts = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}
        group = {
            "targets": ["Linear"],
            "weights": weights,
            "input_activations": acts,
            "format": "float-quantized",
        }
        return {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": group},
            "ignore": ["lm_head"],
            "quantization_status": "compressed",
        }
    strategy = "channel" if fmt.group == -1 else "group"
    weights = {
        "num_bits": fmt.bits,
        "type": "int",
        "symmetric": fmt.sym,
        "strategy": strategy,
        "group_size": None if fmt.group == -1 else fmt.group,
        "actorder": "group" if fmt.act_order else None,
    }
    group = {"targets": ["Linear"], "weights": weights, "input_activations": None}
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": group},
        "ignore": ["lm_head"],
        "quantization_status": "compressed",
    }


def _input_key(name: str) -> str:
    """Projections that read the same input share one act-order permutation (as real GPTQ runs produce)."""
    for proj, key in (
        ("q_proj", "qkv"),
        ("k_proj", "qkv"),
        ("v_proj", "qkv"),
        ("gate_proj", "gu"),
        ("up_proj", "gu"),
    ):
        if f".{proj}." in name:
            return name.replace(f"{proj}.weight", key)
    return name


def write_quantized(
    base: Path, root: Path, fmt: Fmt, seed: int = 0
) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """Returns (quantized dir, dense twin dir, dequantized weights by HF name)."""
    quant_dir, twin_dir = root / f"{base.name}-{fmt.label}", root / f"{base.name}-{fmt.label}-twin"
    tensors = load_file(str(base / "model.safetensors"))
    rng = np.random.default_rng(seed)
    perms: dict[str, np.ndarray] = {}
    packed: dict[str, torch.Tensor] = {}
    twin: dict[str, torch.Tensor] = {}
    dense: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in PROJ:
            perm = None
            if fmt.act_order:
                perm = perms.setdefault(_input_key(name), rng.permutation(t.shape[1]))
            parts, deq = quantize_tensor(t, fmt, perm)
            packed |= {f"{module}.{suffix}": v.contiguous() for suffix, v in parts.items()}
            twin[name] = dense[name] = deq
        else:
            packed[name] = twin[name] = t.float().contiguous()
    for out, weights, qc in ((quant_dir, packed, quantization_config(fmt)), (twin_dir, twin, None)):
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(base, out, ignore=shutil.ignore_patterns("*.safetensors"))
        save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
        cfg = json.loads((out / "config.json").read_text())
        cfg.pop("quantization_config", None)
        if qc is not None:
            cfg["quantization_config"] = qc
        (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return quant_dir, twin_dir, dense

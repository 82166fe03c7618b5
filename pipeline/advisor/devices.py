"""Target devices for the advisor: memory, bandwidth and peak matrix rates per GPU type, and the local one.

Figures are the vendors' datasheet peaks for dense math (no sparsity), so a bound computed from them is
a true lower bound; measured ceilings are lower (the design brief's H200 figures, ~790 TFLOP/s bf16 and
~4.3 TB/s copy, are 80-90 % of these). ``cpu`` is this project's 2-core CI host as measured in
benchmarks/RESULTS.md (float32, the engine's CPU dtype), with the engine's CPU KV pool default.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, replace

GIB = 1 << 30
CPU_DEFAULT_KV_BYTES = 512 * (
    1 << 20
)  # engine/runner/model_runner.py: the CPU KV pool when none is configured


@dataclass(frozen=True)
class Device:
    """``flops`` maps a math precision (bf16, fp8, int8, fp32) to dense peak FLOP/s (OP/s for int8)."""

    name: str
    memory_bytes: int
    bytes_per_s: float
    flops: dict[str, float]
    dtype: str = "bfloat16"  # what the engine runs in here (weights without quantization, and the KV cache)
    is_gpu: bool = True
    kv_pool_bytes: int | None = None  # fixed KV pool (the engine's CPU default); None: what memory leaves
    source: str = "datasheet"
    devices: int = 1  # a tensor-parallel group counts as one device with the members' sums
    interconnect: str = "nvlink"  # between GPUs of one machine: "nvlink" (SXM boards) or "pcie"

    def group(self, size: int) -> Device:
        """``size`` of these devices as one tensor-parallel engine: memory, bandwidth and peaks add up."""
        if size <= 1:
            return self
        return replace(
            self,
            name=f"{self.name} x{size}",
            memory_bytes=self.memory_bytes * size,
            bytes_per_s=self.bytes_per_s * size,
            flops={k: v * size for k, v in self.flops.items()},
            devices=self.devices * size,
        )

    def peak(self, precision: str) -> float:
        """Peak rate for a weight precision: fp8 W8A8 uses the fp8 rate where the chip has one; weight-only
        int8/int4 dequantize into bf16 matrix products."""
        if precision == "fp8" and "fp8" in self.flops:
            return self.flops["fp8"]
        return self.flops.get("bf16") or self.flops["fp32"]


DEVICES: dict[str, Device] = {
    "h200": Device("h200", 141 * 10**9, 4.8e12, {"bf16": 989e12, "fp8": 1979e12, "int8": 1979e12}),
    "h100": Device("h100", 80 * 10**9, 3.35e12, {"bf16": 989e12, "fp8": 1979e12, "int8": 1979e12}),
    "a100-80g": Device("a100-80g", 80 * 10**9, 2.039e12, {"bf16": 312e12, "int8": 624e12}),
    "l4": Device(
        "l4", 24 * 10**9, 300e9, {"bf16": 121e12, "fp8": 242.5e12, "int8": 242.5e12}, interconnect="pcie"
    ),
}
GPU_NAMES = tuple(DEVICES)
CHOICES = (*GPU_NAMES, "cpu", "local")
# nvidia-smi names -> our keys (first match wins; "H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", ...)
_SMI_NAMES = (("H200", "h200"), ("H100", "h100"), ("A100", "a100-80g"), ("L4", "l4"))


def cpu_device() -> Device:
    """This host: its RAM, the CI host's measured float32 ceilings, the engine's 512 MiB CPU KV pool."""
    return Device(
        "cpu",
        _host_memory_bytes(),
        7e9,
        {"fp32": 84e9},
        dtype="float32",
        is_gpu=False,
        kv_pool_bytes=CPU_DEFAULT_KV_BYTES,
        source="measured on the 2-core CI host (benchmarks/RESULTS.md)",
    )


def _host_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def local_device() -> Device:
    """The first CUDA GPU as nvidia-smi names it (no torch needed), mapped to a known type with its real
    memory; the CPU when there is none or it is of an unknown type (then say so)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
            name, mib = [x.strip() for x in out.splitlines()[0].split(",")[:2]]
            for marker, key in _SMI_NAMES:
                if marker in name.upper():
                    return replace(
                        DEVICES[key], memory_bytes=int(float(mib)) * (1 << 20), source=f"local {name}"
                    )
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            pass
    return cpu_device()


def get_device(name: str) -> Device:
    """``h200``, ``h100``, ``a100-80g``, ``l4``, ``cpu`` or ``local``; ValueError naming the choices."""
    key = name.lower()
    if key in DEVICES:
        return DEVICES[key]
    if key == "cpu":
        return cpu_device()
    if key == "local":
        return local_device()
    raise ValueError(f"unknown GPU type {name!r}; choose one of {', '.join(CHOICES)}")

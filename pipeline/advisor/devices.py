"""Target devices for the advisor: memory, bandwidth and peak matrix rates per GPU type, and the local one.

Figures are the vendors' datasheet peaks for dense math (no sparsity), so a bound computed from them is
a true lower bound; measured ceilings are lower (the design brief's H200 figures, ~790 TFLOP/s bf16 and
~4.3 TB/s copy, are 80-90 % of these). ``cpu`` is this host, priced by its class (``CPU_CLASSES``:
AMX tiles, Zen 5's AVX512-BF16, other AVX512-BF16, or neither, read from /proc/cpuinfo's flags) with
the ceilings measured on such a CPU at one compute thread (what the engine runs on a 2-core host), and
the engine's CPU KV pool default. Its dtype is float32 until the advisor resolves the engine's own
choice for the model (bf16 for the embedded GGUF on a CPU with native bf16).
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
    cpu_class: str = ""  # a CPU's class in CPU_CLASSES (its efficiency prior in bf16 differs by class)

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

    @property
    def cpu_bf16(self) -> bool:
        """A CPU whose matmuls the engine runs in bf16: it has native bf16 and the engine's dtype is bf16."""
        return not self.is_gpu and self.dtype == "bfloat16" and "bf16" in self.flops

    def peak(self, precision: str) -> float:
        """Peak rate for a weight precision: fp8 W8A8 uses the fp8 rate where the chip has one; weight-only
        int8/int4 dequantize into bf16 matrix products. A CPU multiplies in the engine's dtype there
        (bf16 only where it has native bf16 and the engine picked it), whatever the weights are stored in."""
        if not self.is_gpu:
            return self.flops["bf16"] if self.cpu_bf16 else self.flops["fp32"]
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


@dataclass(frozen=True)
class CpuClass:
    """Measured ceilings of one kind of CPU at one compute thread: matmul FLOP/s per precision, copy B/s."""

    name: str
    flops: dict[str, float]
    bytes_per_s: float
    source: str


# benchmarks/roofline.py's CPU ceilings as benchmarks/cpu_path.py measures them in each run (1 thread; the
# highest of the runs in benchmarks/results/cpu_path_*.json, so that the bound stays a lower bound)
CPU_CLASSES = {
    "amx": CpuClass(
        "amx",
        {"fp32": 217e9, "bf16": 1572e9},
        16.9e9,
        "measured on a 2-core AMX Xeon, 1 thread (benchmarks/RESULTS.md issue 24, eighth and ninth rounds)",
    ),
    "zen5": CpuClass(
        "zen5",
        {"fp32": 100.5e9, "bf16": 445.7e9},
        39.3e9,
        "measured on a 2-core AMD EPYC Zen 5 (AVX512-BF16 on 512-bit datapaths), 1 thread "
        "(benchmarks/RESULTS.md issue 24, tenth round)",
    ),
    "avx512-bf16": CpuClass(
        "avx512-bf16",
        {"fp32": 97e9, "bf16": 209e9},
        28.7e9,
        "measured on a 2-core Zen 4, 1 thread (benchmarks/RESULTS.md issue 24, fifth and sixth rounds)",
    ),
    "avx2": CpuClass(
        "avx2", {"fp32": 84e9}, 7e9, "measured on the 2-core AVX2 CI host (benchmarks/RESULTS.md)"
    ),
}


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The instruction-set flags of this host's first CPU (empty where /proc/cpuinfo is not readable)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_class(flags: frozenset[str]) -> CpuClass:
    """AMX tiles (oneDNN multiplies bf16 on them), else AVX512-BF16 (Zen 5 apart: twice Zen 4's bf16
    ceiling), else the float32-only class."""
    if "amx_bf16" in flags and "amx_tile" in flags:
        return CPU_CLASSES["amx"]
    if "avx512_bf16" in flags and "avx512_vp2intersect" in flags:
        # VP2INTERSECT with AVX512-BF16 and no AMX: AMD Zen 5 (Zen 4 lacks VP2INTERSECT; Intel's
        # AVX512-BF16 server parts without AMX, Cooper Lake, lack it too)
        return CPU_CLASSES["zen5"]
    if "avx512_bf16" in flags:
        return CPU_CLASSES["avx512-bf16"]
    return CPU_CLASSES["avx2"]


def cpu_device(flags: frozenset[str] | None = None) -> Device:
    """This host: its RAM, its class's measured ceilings, the engine's 512 MiB CPU KV pool."""
    kind = cpu_class(cpu_flags() if flags is None else flags)
    return Device(
        "cpu",
        _host_memory_bytes(),
        kind.bytes_per_s,
        dict(kind.flops),
        dtype="float32",
        is_gpu=False,
        kv_pool_bytes=CPU_DEFAULT_KV_BYTES,
        source=f"{kind.name}: {kind.source}",
        cpu_class=kind.name,
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

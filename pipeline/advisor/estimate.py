"""Time and cost of the whole dataset: the roofline lower bound per device type, and the range to expect
at the efficiency (achieved / bound) measured so far.

The workload is the sample's requests (prompt length, expected output, prefix-cache hits in prefix
order) standing for ``scale`` times as many, bounded by the engine's per-step token budget and
sequence limit. GPU-hours count every device of a tensor-parallel group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefixflow.pipeline.advisor.devices import DEVICES, Device
from prefixflow.pipeline.advisor.engine_path import CPU_FLOAT32_PACKED_SLOWDOWN, DENSE, EnginePath
from prefixflow.pipeline.advisor.memory import EngineLimits, Footprint, choose_precision, weight_bytes
from prefixflow.pipeline.advisor.roofline import Ceilings, ModelShape, job_cost, lower_bound_seconds
from prefixflow.pipeline.advisor.workload import Workload

# Achieved / roofline bound. CPU (issue 24): the embedded SmolLM2-135M on its default path (dense float32),
# 1 thread, 128-token prompts, 32 new tokens, counted in process CPU-seconds against the float32 matmul
# ceiling measured the same way: 0.51 (batch 16) and 0.58 (batch 64) on a 2-core AMX Xeon, 0.54 and 0.64
# on a 2-core AVX2 EPYC (benchmarks/RESULTS.md "Issue 24", third round); 0.45 leaves room for per-step
# overhead at small batches. (The old 0.05-0.18 came from the 2-layer tiny model, where a step is all
# overhead; the issue-18 demo measured 0.63.) GPU: not measured yet; 0.60 is the H200 goal set there,
# 0.25 a pessimistic floor until benchmarks/gpu_check.sh has run.
EFFICIENCY = {
    "cpu": (
        0.45,
        0.65,
        "measured on the CPU (benchmarks/RESULTS.md, issue 24: SmolLM2 dense float32, batch 16-64, "
        "an AMX Xeon and an AVX2 EPYC)",
    ),
    "cpu-bf16-amx": (
        0.15,
        0.32,
        "measured on an AMX Xeon, 1 thread (benchmarks/RESULTS.md issue 24, ninth round: SmolLM2 dense bf16, "
        "0.19-0.20 of the bound at batch 16-64 with 32 and 128 new tokens, 0.31 at batch 1)",
    ),
    # AVX512-BF16 without AMX reaches a larger share of its (lower) bf16 ceiling than AMX does of its tiles'
    "cpu-bf16": (
        0.30,
        0.65,
        "measured on a Zen 4 and a Zen 5 EPYC, 1 thread (benchmarks/RESULTS.md issue 24, sixth, tenth and "
        "eleventh rounds: SmolLM2 dense bf16, 0.27-0.53 of the bound at batch 16-64 before the native "
        "attention kernel, 0.33-0.78 after it on the Zen 5 (the tenth round's fractions times the "
        "eleventh's speedups, 1.41-2.03x); batch 1 0.28-0.44)",
    ),
    "gpu": (
        0.25,
        0.60,
        "assumed: not yet measured on a GPU (0.60 is the H200 goal in benchmarks/RESULTS.md)",
    ),
}


@dataclass(frozen=True)
class Estimate:
    device: str
    precision: str
    devices_per_lane: int  # tensor-parallel size
    lower_bound_s: float
    compute_s: float
    memory_s: float
    gpu_hours_lower: float
    expected_s: tuple[float, float]
    gpu_hours_expected: tuple[float, float]
    efficiency: tuple[float, float]
    efficiency_source: str
    output_tokens: int
    computed_tokens: int

    @property
    def bound_by(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory bandwidth"

    @property
    def output_tokens_per_s(self) -> tuple[float, float]:
        """Expected output tokens per second of one lane (low, high)."""
        lo, hi = self.expected_s
        return (self.output_tokens / hi if hi else 0.0, self.output_tokens / lo if lo else 0.0)


def efficiency_key(device: Device) -> str:
    """Which measured efficiency prior prices ``device``: a GPU's, the CPU's in bf16, or in float32."""
    if device.is_gpu:
        return "gpu"
    if not device.cpu_bf16:
        return "cpu"
    return "cpu-bf16-amx" if device.cpu_class == "amx" else "cpu-bf16"


def ceilings(device: Device, precision: str, tp: int = 1) -> Ceilings:
    return Ceilings(device.bytes_per_s * tp, device.peak(precision) * tp, device.name, precision)


def bytes_per_param(shape: ModelShape, precision: str) -> float:
    """Weight bytes per matmul parameter at ``precision`` (scales and 16-bit embedding/LM head included)."""
    return weight_bytes(shape, precision) / shape.total_params


def estimate(
    shape: ModelShape,
    device: Device,
    precision: str,
    tp: int,
    w: Workload,
    limits: EngineLimits,
    efficiency: tuple[float, float, str] | None = None,
) -> Estimate:
    """The lower bound is exactly ``roofline.lower_bound_seconds`` of the projected workload."""
    kv_elem = 4 if device.dtype == "float32" else 2
    ceil = ceilings(device, precision, tp)
    args = (
        bytes_per_param(shape, precision),
        kv_elem,
        limits.max_num_batched_tokens,
        limits.max_num_seqs,
        max(w.scale, 1e-9),
    )
    if not w.requests:
        return Estimate(
            device.name, precision, tp, 0.0, 0.0, 0.0, 0.0, (0.0, 0.0), (0.0, 0.0), (1.0, 1.0), "", 0, 0
        )
    cost = job_cost(shape, w.requests, *args)
    bound = lower_bound_seconds(shape, w.requests, ceil, *args)
    lo, hi, source = efficiency or EFFICIENCY[efficiency_key(device)]
    expected = (bound / hi, bound / lo)
    return Estimate(
        device=device.name,
        precision=precision,
        devices_per_lane=tp * device.devices,
        lower_bound_s=bound,
        compute_s=cost.flops / ceil.flops_per_s,
        memory_s=cost.bytes / ceil.bytes_per_s,
        gpu_hours_lower=bound * tp * device.devices / 3600,
        expected_s=expected,
        gpu_hours_expected=(
            expected[0] * tp * device.devices / 3600,
            expected[1] * tp * device.devices / 3600,
        ),
        efficiency=(lo, hi),
        efficiency_source=source,
        output_tokens=cost.output_tokens,
        computed_tokens=cost.computed_tokens,
    )


def estimate_all(
    shape: ModelShape,
    cfg: dict[str, Any],
    target: Device,
    w: Workload,
    limits: EngineLimits,
    seqs: Footprint,
    target_efficiency: tuple[float, float, str] | None = None,
    path: EnginePath = DENSE,
) -> list[Estimate]:
    """The target device first, then every GPU type, each at the precision question 1 picks for it,
    except that a checkpoint the engine runs packed (``path``) is priced as that path."""
    devices = [target] + [d for name, d in DEVICES.items() if name != target.name]
    out = []
    for d in devices:
        precision, tp = choose_precision(shape, cfg, d, limits, seqs)
        eff = target_efficiency if d is target else None
        if path.precision is not None and tp == 1:
            out.append(_packed(shape, d, path, w, limits, eff, precision))
        else:
            out.append(estimate(shape, d, precision, tp, w, limits, eff))
    return out


def _packed(
    shape: ModelShape,
    device: Device,
    path: EnginePath,
    w: Workload,
    limits: EngineLimits,
    measured: tuple[float, float, str] | None,
    dense: str,
) -> Estimate:
    """The engine's packed path: the bound reads the packed weights; on the CPU in float32 the packed
    kernels are slower than the dense matmul, so the expected range is the dense path's times that
    slowdown (as an efficiency against the packed bound)."""
    assert path.precision is not None
    if measured is not None or device.is_gpu or device.dtype != "float32":
        return estimate(shape, device, path.precision, 1, w, limits, measured)
    lo, hi, _ = EFFICIENCY["cpu"]
    packed = estimate(shape, device, path.precision, 1, w, limits)
    plain = estimate(shape, device, dense, 1, w, limits)
    ratio = packed.lower_bound_s / plain.lower_bound_s if plain.lower_bound_s else 1.0
    slow_lo, slow_hi = CPU_FLOAT32_PACKED_SLOWDOWN
    source = (
        f"CPU, float32, {path.label}: the dense float32 efficiency {lo:.2f}-{hi:.2f} (issue 5 throughput) "
        f"over the packed path's {slow_lo}-{slow_hi}x per-layer slowdown (benchmarks/RESULTS.md "
        "'Quantized weights on the CPU')"
    )
    return estimate(
        shape, device, path.precision, 1, w, limits, (ratio * lo / slow_hi, ratio * hi / slow_lo, source)
    )

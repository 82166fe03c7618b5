"""The local devices a thread lane can own, and the name of each device's concurrency limit.

A GPU is named by its physical id (the `CUDA_VISIBLE_DEVICES` entry: an index or a `GPU-…`
UUID), not by the CUDA ordinal the process sees it under, so two flows with different
`CUDA_VISIBLE_DEVICES` still agree on which limit guards which GPU. Without GPUs (or with
`gpus_per_lane=0`) there is one device, the CPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

CPU_ID = "cpu"


def gpu_ids() -> list[str]:
    """Physical ids of the GPUs this process may use, in CUDA ordinal order.

    `CUDA_VISIBLE_DEVICES` if set (its entries, `-1` and anything after it dropped as CUDA
    does), else `0 … n-1` for the `n` GPUs `nvidia-smi -L` lists.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids: list[str] = []
        for entry in (e.strip() for e in env.split(",")):
            if not entry or entry == "-1":
                break
            ids.append(entry)
        return ids
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i in range(sum(1 for line in out.splitlines() if line.startswith("GPU ")))]


@dataclass(frozen=True)
class DeviceGroup:
    """The devices one lane owns: physical `ids` and, for GPUs, their CUDA `ordinals` here."""

    ids: tuple[str, ...]
    ordinals: tuple[int, ...] = ()

    @property
    def is_cpu(self) -> bool:
        return not self.ordinals

    def limit_names(self, prefix: str) -> list[str]:
        """`<prefix>-cpu`, or `<prefix>-gpu-<id>` for every GPU of the group."""
        if self.is_cpu:
            return [f"{prefix}-{CPU_ID}"]
        return [f"{prefix}-gpu-{_safe(i)}" for i in self.ids]

    def describe(self) -> str:
        return CPU_ID if self.is_cpu else "GPU " + ",".join(self.ids)


def device_groups(gpus_per_lane: int, ids: list[str]) -> list[DeviceGroup]:
    """The disjoint device groups of this machine: consecutive runs of `gpus_per_lane` GPUs
    (GPUs left over at the end are not used), or the single CPU group."""
    if gpus_per_lane <= 0 or not ids:
        if gpus_per_lane > 0:
            raise ValueError(f"gpus_per_lane={gpus_per_lane} but no GPU is visible to this process")
        return [DeviceGroup(ids=(CPU_ID,))]
    if gpus_per_lane > len(ids):
        raise ValueError(f"gpus_per_lane={gpus_per_lane} but only {len(ids)} GPU(s) are visible: {ids}")
    starts = range(0, len(ids) - gpus_per_lane + 1, gpus_per_lane)
    return [
        DeviceGroup(ids=tuple(ids[s : s + gpus_per_lane]), ordinals=tuple(range(s, s + gpus_per_lane)))
        for s in starts
    ]


def _safe(device_id: str) -> str:
    """A device id as a limit-name part: lower case, anything but letters, digits, `-` and `_`
    (a MIG id's `/`, for instance) replaced by `-`."""
    return re.sub(r"[^a-z0-9_-]", "-", device_id.lower())

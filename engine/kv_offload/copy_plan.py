"""The block copies one step needs before its forward pass, in the order they must run.

Persists (device -> disk writer, ``kv_cache_dir``) and offloads (device -> host) go first: a device block evicted this step may be handed out again, in
the same step, as the target of a reload or a partial-block copy. Reloads (host -> device) go next: a
block reloaded this step may be the source of a partial-block copy. Partial-block copies (device ->
device, copy-on-write of a shared last block) go last; their sources are held through the step, so
nothing this step allocates can overwrite one. The plan is a flat int64 tensor so rank 0 can
broadcast it to tensor-parallel workers exactly like a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class CopyPlan:
    offload: list[tuple[int, int]] = field(default_factory=list)  # (device block, host block)
    local: list[tuple[int, int]] = field(default_factory=list)  # (source device block, target device block)
    reload: list[tuple[int, int]] = field(default_factory=list)  # (host block, device block)
    # (device block, digest high, digest low): a computed prompt block for the disk tier's writer
    persist: list[tuple[int, int, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.offload or self.local or self.reload or self.persist)

    def pack(self) -> torch.Tensor:
        flat = [len(self.offload), len(self.local), len(self.reload), len(self.persist)]
        for entries in (self.offload, self.local, self.reload, self.persist):
            flat.extend(x for entry in entries for x in entry)
        return torch.tensor(flat, dtype=torch.int64)

    @classmethod
    def unpack(cls, payload: torch.Tensor) -> CopyPlan:
        values = payload.tolist()
        counts, rest = values[:4], values[4:]
        lists: list[list[tuple[int, ...]]] = []
        pos = 0
        for n, width in zip(counts, (2, 2, 2, 3)):
            lists.append([tuple(rest[pos + width * i : pos + width * (i + 1)]) for i in range(n)])
            pos += width * n
        return cls(*lists)  # type: ignore[arg-type]

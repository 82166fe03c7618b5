"""The persistent KV tier as the scheduler sees it (``kv_cache_dir``): which prompt blocks to write,
how far a prefix continues on disk, and whether reading it beats recomputing it.

It sits below the host tier: a device miss continues in host memory, then on disk; disk blocks are
read into host blocks (the staging area) and reloaded to the device like host hits. Writes are
write-through of full prompt blocks when they are computed (not only on eviction), so a run that
ends, or is killed, leaves its prefixes for the next one. Output blocks are not written: a later run
recomputes its outputs anyway, and preempted requests are the host tier's business.

Only rank 0 decides: it checks that its own file exists (a stat, no read), asks the cost model, and
has every rank read its part (``loader``); the ranks agree on how many leading blocks all of them
read and checked, and the rest is a miss.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefixflow.engine.kv_offload import disk_files
from prefixflow.engine.kv_offload.copy_plan import CopyPlan
from prefixflow.engine.kv_offload.cost_model import CostModel
from prefixflow.engine.loading.model_config import ModelConfig

RECENT = 1 << 16  # digests this engine wrote lately: not looked up on disk again
STAGING_BYTES = 1 << 30  # kv_cache_dir without kv_offload_bytes: host memory to read blocks into


def staging_blocks(device_blocks: int, block_bytes: int, ranks: int) -> int:
    """Host blocks ``kv_cache_dir`` reads into when ``kv_offload_bytes`` is 0: as many as the device
    pool (one step can reload no more), at most ``STAGING_BYTES`` over all ranks."""
    return max(1, min(device_blocks, STAGING_BYTES // (block_bytes * ranks)))


def disk_namespace(
    model_digest: str,
    model_cfg: ModelConfig,
    dtype: str,
    block_size: int,
    tp: int,
    pp: int,
    stages: Sequence[tuple[int, int]],
    kernels: str,
    device: str,
) -> tuple[bytes, dict[str, Any]]:
    """Everything that decides a block file's bytes: the model (weights, config, tokenizer,
    quantization: ``model_identity``'s digest), its shape and rope, the KV dtype, block size and
    payload layout, how ranks split it (tensor x pipeline shape, the layer split), and the kernels and
    device that computed it. Any difference is another namespace, so another model, dtype or split
    never reads these files. Returns the 16-byte namespace and what it was made of."""
    what: dict[str, Any] = {
        "model_digest": model_digest,
        "model_config": asdict(model_cfg),
        "kv_dtype": dtype,
        "block_size": block_size,
        "layout_version": disk_files.LAYOUT_VERSION,
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "stages": [list(s) for s in stages],
        "kernels": kernels,
        "device": device,
    }
    blob = json.dumps(what, sort_keys=True, default=str).encode()
    return hashlib.blake2b(blob, digest_size=16).digest(), what


@dataclass
class DiskTierCounters:
    lookups: int = 0  # prefixes that continued past the host tier and were looked for on disk
    found_blocks: int = 0  # blocks rank 0's files showed on disk
    loaded_blocks: int = 0  # read and checked on every rank, then reloaded instead of recomputed
    failed_blocks: int = 0  # found but not loaded: corrupt, evicted meanwhile, or missing on a rank
    declined_blocks: int = 0  # found, but the cost model chose recompute
    written_blocks: int = 0  # prompt blocks handed to the writers


class DiskTier:
    def __init__(
        self,
        root: Path,
        namespace: bytes,
        cost: CostModel | None,
        loader: Callable[[list[tuple[bytes, int]]], int],
    ) -> None:
        """``loader``: every rank reads ``(digest, host block)`` pairs into its host store; returns how
        many leading pairs all ranks read and checked."""
        self.namespace = namespace
        self.folder = root / namespace.hex()
        self.cost = cost
        self.loader = loader
        self.counters = DiskTierCounters()
        self._recent: OrderedDict[bytes, None] = OrderedDict()

    def digests(
        self, known: list[bytes], token_ids: Sequence[int], count: int, block_size: int
    ) -> list[bytes]:
        """``known`` (a request's chain so far) extended in place to the first ``count`` blocks."""
        if len(known) < count:
            seed = known[-1] if known else self.namespace
            known.extend(disk_files.block_digests(seed, token_ids, len(known), count, block_size))
        return known

    def on_disk(self, digest: bytes) -> bool:
        return digest in self._recent or disk_files.block_path(self.folder, digest, 0).exists()

    def run_on_disk(self, digests: Sequence[bytes], first: int, last: int) -> int:
        """How many blocks from ``first`` rank 0 holds files of, in a row."""
        n = 0
        while first + n < last and self.on_disk(digests[first + n]):
            n += 1
        return n

    def worth_reading(self, first_token: int, num_blocks: int, block_size: int) -> bool:
        if self.cost is None:
            return True
        if self.cost.disk_cheaper(first_token, num_blocks * block_size, num_blocks):
            return True
        self.counters.declined_blocks += num_blocks
        return False

    def load(self, entries: list[tuple[bytes, int]]) -> int:
        loaded = self.loader(entries) if entries else 0
        self.counters.loaded_blocks += loaded
        self.counters.failed_blocks += len(entries) - loaded
        for digest, _ in entries[loaded:]:
            self._recent.pop(digest, None)
        return loaded

    def persist(self, digests: list[bytes], index: int, device_block: int, plan: CopyPlan) -> None:
        """Write the just-computed prompt block ``index`` (in ``device_block``) unless it is on disk."""
        digest = digests[index]
        if self.on_disk(digest):
            return
        self._recent[digest] = None
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)
        hi, lo = digest_words(digest)
        plan.persist.append((device_block, hi, lo))
        self.counters.written_blocks += 1


def digest_words(digest: bytes) -> tuple[int, int]:
    """A 16-byte digest as two int64s, for int64 payloads (copy plans, shard commands)."""
    return int.from_bytes(digest[:8], "little", signed=True), int.from_bytes(
        digest[8:], "little", signed=True
    )


def digest_of(hi: int, lo: int) -> bytes:
    """The inverse of ``digest_words``."""
    return hi.to_bytes(8, "little", signed=True) + lo.to_bytes(8, "little", signed=True)

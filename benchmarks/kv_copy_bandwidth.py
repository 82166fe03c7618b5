"""Host KV tier copy bandwidth (issue 28, GPU owed): HostKVStore offload and reload of whole blocks
against the measured ceiling of one contiguous pinned copy of the same bytes, both directions.

Llama-3.1-8B shape in bf16 by default (32 layers, 8 KV heads, head_dim 128, 16-token blocks: 2 MiB
per block). On a CPU-only machine it measures memcpy and says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from prefixflow.engine.kv_offload.copy_plan import CopyPlan
from prefixflow.engine.kv_offload.host_store import HostKVStore


def timed(fn, device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=256, help="device blocks (the copies move half of them)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = (args.layers, 2, args.blocks, args.block_size, args.kv_heads, args.head_dim)
    cache = torch.randn(shape, dtype=dtype, device=device)
    n = args.blocks // 2
    store = HostKVStore(cache, n)
    block_bytes = cache[:, :, 0].numel() * cache.element_size()
    moved = n * block_bytes
    pin = device.type == "cuda"
    flat_dev = torch.empty(moved // cache.element_size(), dtype=dtype, device=device)
    flat_host = torch.empty(moved // cache.element_size(), dtype=dtype, pin_memory=pin)
    d2h_ceiling = moved / timed(lambda: flat_host.copy_(flat_dev, non_blocking=True), device, args.repeats)
    h2d_ceiling = moved / timed(lambda: flat_dev.copy_(flat_host, non_blocking=True), device, args.repeats)
    src = list(range(0, args.blocks, 2))  # every other block: a scattered set, as eviction leaves it
    offload = CopyPlan(offload=[(d, h) for h, d in enumerate(src)])
    reload = CopyPlan(reload=[(h, d) for h, d in enumerate(src)])
    off_bw = moved / timed(lambda: store.apply(offload), device, args.repeats)
    before = cache[:, :, src].clone()
    cache[:, :, src] = 0
    re_bw = moved / timed(lambda: store.apply(reload), device, args.repeats)
    exact = bool(torch.equal(cache[:, :, src], before))
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "block_bytes": block_bytes,
        "blocks_moved": n,
        "bytes_moved": moved,
        "d2h_ceiling_gb_s": d2h_ceiling / 1e9,
        "h2d_ceiling_gb_s": h2d_ceiling / 1e9,
        "offload_gb_s": off_bw / 1e9,
        "reload_gb_s": re_bw / 1e9,
        "offload_fraction": off_bw / d2h_ceiling,
        "reload_fraction": re_bw / h2d_ceiling,
        "reloaded_bytes_equal": exact,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if not exact:
        raise SystemExit("reloaded blocks differ from what was offloaded")


if __name__ == "__main__":
    main()

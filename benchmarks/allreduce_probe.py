"""The cost of one all-reduce alone, through the engine's own process groups (issue 13).

Inside an engine step, an all-reduce also waits for the slower rank; this probe separates the
communication: N ranks (the engine's ``WorkerPool``: spawned workers, gloo on CPU, NCCL on CUDA) do
nothing but back-to-back all-reduces of ``[tokens, hidden]`` tensors, and rank 0 reports the median.

    python -m benchmarks.allreduce_probe --hidden 2048 --tokens 8 512 --world 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import environment, write_json
from prefixflow.engine.distributed.group import ParallelGroup
from prefixflow.engine.distributed.pool import WorkerPool

PROBE = 1  # payload: [tokens, hidden, repeats]


class Probe:
    def __init__(self, group: ParallelGroup) -> None:
        self.group = group

    def handle(self, command: int, payload: torch.Tensor) -> list[float]:
        tokens, hidden, repeats = (int(v) for v in payload)
        x = torch.ones(tokens, hidden, device=self.group.device)
        self.group.all_reduce(x)  # line the ranks up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            self.group.all_reduce(x)
            if x.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return times


def measure(
    world: int, hidden: int, tokens: list[int], repeats: int, device: str = "cpu"
) -> dict[int, float]:
    """Median seconds of one all-reduce of ``[t, hidden]`` float32, per ``t``."""
    devices = [torch.device(device if device == "cpu" else f"cuda:{r}") for r in range(world)]
    import importlib

    factory = importlib.import_module("benchmarks.allreduce_probe").Probe  # importable by the workers
    pool = WorkerPool(world, devices, 60.0, factory, num_threads=1)
    try:
        probe = factory(pool.group)
        pool.wait_ready()
        out = {}
        for t in tokens:
            times = pool.run(probe, PROBE, torch.tensor([t, hidden, repeats]))
            out[t] = statistics.median(times)  # type: ignore[arg-type]
        return out
    finally:
        pool.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--tokens", type=int, nargs="+", default=[8, 512])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    for t, s in measure(args.world, args.hidden, args.tokens, args.repeats, args.device).items():
        mib = t * args.hidden * 4 / 2**20
        rows.append({"tokens": t, "hidden": args.hidden, "mib": mib, "median_us": 1e6 * s})
        print(
            f"all-reduce [{t}, {args.hidden}] float32 ({mib:.2f} MiB) over {args.world} ranks: {1e6 * s:.0f} us"
        )
    write_json(
        args.json,
        {"benchmark": "allreduce_probe", "args": vars(args), "environment": environment(), "rows": rows},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

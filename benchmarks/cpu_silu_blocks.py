"""kernels/cpu_ops.silu_and_mul in row blocks against one pass over the whole input (issue 24).

Per (dtype, rows) of SmolLM2-135M's fused gate|up output (3,072 wide): process CPU ms per call,
1 thread, the two interleaved A B A B over ``--rounds`` timed blocks, min and median; the results are
checked equal bit for bit. "one pass" is the same function with the block size raised past the input.

    python -m benchmarks.cpu_silu_blocks --json benchmarks/results/cpu_silu_blocks.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.common import environment, print_table, write_json
from prefixflow.kernels import cpu_ops


def cpu_ms(x: torch.Tensor, block_rows: int, calls: int) -> float:
    saved, cpu_ops.SILU_BLOCK_ROWS = cpu_ops.SILU_BLOCK_ROWS, block_rows
    try:
        cpu_ops.silu_and_mul(x)
        start = time.process_time()
        for _ in range(calls):
            cpu_ops.silu_and_mul(x)
        return (time.process_time() - start) / calls * 1e3
    finally:
        cpu_ops.SILU_BLOCK_ROWS = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="64,512,4096")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    records = []
    load = os.getloadavg()
    for dtype in (torch.bfloat16, torch.float32):
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, 3072).to(dtype)
            saved, cpu_ops.SILU_BLOCK_ROWS = cpu_ops.SILU_BLOCK_ROWS, 1 << 40
            whole = cpu_ops.silu_and_mul(x)
            cpu_ops.SILU_BLOCK_ROWS = saved
            assert torch.equal(whole, cpu_ops.silu_and_mul(x))
            calls = max(3, 20_000 // rows)
            one, blocks = [], []
            for _ in range(args.rounds):
                one.append(cpu_ms(x, 1 << 40, calls))
                blocks.append(cpu_ms(x, saved, calls))
            records.append(
                {
                    "dtype": str(dtype).removeprefix("torch."),
                    "rows": rows,
                    "one_pass_ms_min": min(one),
                    "one_pass_ms_median": statistics.median(one),
                    "blocks_ms_min": min(blocks),
                    "blocks_ms_median": statistics.median(blocks),
                    "speedup_median": statistics.median(one) / statistics.median(blocks),
                }
            )
    print_table(records, list(records[0]), title=f"silu_and_mul, 1 thread, load average {load[0]:.1f}")
    write_json(args.json, {"env": environment(), "load_average": load, "results": records})


if __name__ == "__main__":
    main()

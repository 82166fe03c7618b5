"""CPU paged attention, this tree's kernels/cpu_attention.py against an older revision's (issue 24).

Per case (batch, query length, context length, dtype): process CPU ms per call, 1 thread, the two
implementations interleaved A B A B over the same random paged cache (SmolLM2-135M heads: 9 query,
3 KV, head dim 64, blocks of 16), min and median of ``--rounds``; every call after the first reuses
the step's plan, as the engine's 30 layers do. The old module is read with ``git show REV:path``.

    python -m benchmarks.cpu_attention_ab --old e8e2195

``--native``: this tree's torch path (cpu_attention, "old") against the native row kernel
(kernels/cpu_row_attention.py, "new") instead, at ``--threads`` compute threads:

    python -m benchmarks.cpu_attention_ab --native --threads 1
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from prefixflow.kernels import cpu_attention, cpu_row_attention

CASES = [(16, 1, 144), (64, 1, 144), (16, 128, 128), (1, 1, 1024), (16, 1, 1024)]
NATIVE_CASES = [(1, 1, 144), (8, 5, 200), (32, 128, 128), (64, 1, 1024)]  # the native A/B adds these


def old_module(rev: str) -> ModuleType:
    root = Path(cpu_attention.__file__).resolve().parents[1]  # the checkout this tree imports
    text = subprocess.run(
        ["git", "-C", str(root), "show", f"{rev}:kernels/cpu_attention.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "cpu_attention_old.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("cpu_attention_old", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def case(b: int, q: int, length: int, dtype: torch.dtype) -> tuple[Any, ...]:
    hq, hkv, d, bs = 9, 3, 64, 16
    blocks = b * -(-length // bs)
    k = torch.randn(blocks + 4, bs, hkv, d, dtype=dtype)
    v = torch.randn(blocks + 4, bs, hkv, d, dtype=dtype)
    tables = torch.randperm(blocks + 4)[:blocks].view(b, -1).int()
    lens = torch.full((b,), length, dtype=torch.int32)
    if q == 1:
        lens[::2] -= 5  # ragged decode contexts
    starts = torch.arange(0, b * q + 1, q, dtype=torch.int32)
    return torch.randn(b * q, hq, d, dtype=dtype), k, v, tables, starts, lens, d**-0.5


def cpu_ms(fn: Any, args: tuple[Any, ...], n: int) -> float:
    fn(*args)
    t = time.process_time()
    for _ in range(n):
        fn(*args)
    return 1000 * (time.process_time() - t) / n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", default="e8e2195")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--native", action="store_true", help="torch path vs the native row kernel")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    old_fn, new_fn = (
        (cpu_attention.paged_attention, cpu_row_attention.paged_attention_rows)
        if args.native
        else (old_module(args.old).paged_attention, cpu_attention.paged_attention)
    )
    cases = CASES + NATIVE_CASES if args.native else CASES
    print(
        f"load average {os.getloadavg()[0]:.1f}; torch {torch.__version__}; threads {args.threads}; "
        f"old = {'cpu_attention' if args.native else args.old}",
        file=sys.stderr,
    )
    print(
        "| dtype | batch | query | context | old ms min / median | new ms min / median | old / new (medians) |"
    )
    print("|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16):
            for b, q, length in cases:
                inputs = case(b, q, length, dtype)
                times: dict[str, list[float]] = {"old": [], "new": []}
                for _ in range(args.rounds):
                    times["old"].append(cpu_ms(old_fn, inputs, args.calls))
                    times["new"].append(cpu_ms(new_fn, inputs, args.calls))
                o, n = (statistics.median(times[x]) for x in ("old", "new"))
                print(
                    f"| {str(dtype).removeprefix('torch.')} | {b} | {q} | {length} | {min(times['old']):.2f} / {o:.2f} "
                    f"| {min(times['new']):.2f} / {n:.2f} | {o / n:.1f}x |",
                    flush=True,
                )
    print(f"load average after {os.getloadavg()[0]:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""What batch-invariant scoring costs a label job: the same label scoring with ``batch_invariant`` off and
on, interleaved A B A B in one process, in process CPU-seconds (wall too; wall is noise on a shared
host), plus whether a row's scores are the same bits alone and inside the batch.

    python -m benchmarks.batch_invariant_bench --rounds 3 [--dtype auto|float32] [--threads 1]

Workload: the 60 reviews of ``benchmarks/data/reviews.jsonl`` as a plain label prompt, three labels
(" positive", " negative", " neutral") scored with ``LLM.score_choices`` on the embedded model, prefix
caching on (the prompt is shared by a row's three choices). Each measurement is a fresh engine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from prefixflow.engine import LLM

LABELS = [" positive", " negative", " neutral"]
DATA = Path(__file__).parent / "data" / "reviews.jsonl"


def _prompts() -> list[str]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    return [
        f"Review of {r['product']}: {r['text']}\nSentiment (positive, negative or neutral):" for r in rows
    ]


def _score(invariant: bool, dtype: str, prompts: list[str]) -> tuple[float, float, list[list[float] | str]]:
    llm = LLM("smollm2-135m-instruct", dtype=dtype, batch_invariant=invariant)
    cpu, wall = time.process_time(), time.perf_counter()
    scores = llm.score_choices(prompts, [LABELS] * len(prompts))
    return time.process_time() - cpu, time.perf_counter() - wall, scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompts = _prompts()
    figures: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    batch: dict[bool, list[list[float] | str]] = {}
    print(f"load average at start: {os.getloadavg()}")
    for _ in range(args.rounds):
        for invariant in (False, True):
            cpu, wall, scores = _score(invariant, args.dtype, prompts)
            figures[invariant].append((cpu, wall))
            batch[invariant] = scores
    print(f"load average at end: {os.getloadavg()}")
    for invariant in (False, True):
        cpus = [c for c, _ in figures[invariant]]
        walls = [w for _, w in figures[invariant]]
        print(
            f"batch_invariant={invariant!s:<5} CPU s min {min(cpus):.2f} median {statistics.median(cpus):.2f}"
            f" | wall s min {min(walls):.2f} median {statistics.median(walls):.2f}"
        )
    ratio = [a[0] / b[0] for a, b in zip(figures[True], figures[False])]
    print(f"CPU-seconds on/off per round: {', '.join(f'{r:.2f}' for r in ratio)}")
    for invariant in (False, True):
        alone = [_score(invariant, args.dtype, [p])[2][0] for p in prompts[:8]]
        same = sum(a == b for a, b in zip(alone, batch[invariant][:8]))
        print(f"batch_invariant={invariant!s:<5} rows whose scores alone == in the batch: {same}/8")


if __name__ == "__main__":
    main()

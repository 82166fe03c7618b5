"""How much n-gram speculation could gain on a cell of spec_bench, at best: a replay bound.

Verification is exact, so whether a draft is accepted depends only on the target's own output: the
tokens speculation off produces. This replays those outputs through the engine's proposers (the
request's own lookup, ``NgramIndex``; then the cross-request pool, ``OutputPool``) in spec_bench's
static batches, and prices every step with the step-cost fit that an ``auto`` engine measured in
the same process (``fixed + per_token * tokens + per_row * sampled rows``), plus the measured
prefill (the same cell with ``max_tokens=1``). Three plans:

- ``off``: one token per request per step (checks the price model against the measured off run);
- ``every proposal``: each request verifies everything the lookup proposes, up to k (a fixed k);
- ``oracle``: each request verifies only the drafts that will be accepted. No policy can do better
  with these proposals: it would need to know the target's next tokens.

The pool is generous: a request's output is indexed as soon as it is replayed, so later requests of
the same batch see all of it (in the engine they see it only as far as it was produced). Run:

    PYTHONPATH=. python -m benchmarks.spec_bound --workload summarize --batch 8 --requests 32 \
        --json benchmarks/results/spec_zen5_bound_summarize_b8x32.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from benchmarks.spec_bench import MODES, run_cell, workloads
from prefixflow.engine import LLM
from prefixflow.engine.speculative.ngram import NgramIndex
from prefixflow.engine.speculative.output_pool import OutputPool
from prefixflow.engine.speculative.policy import StepTerms
from prefixflow.engine.speculative.runs import accepted_length


@dataclass(frozen=True)
class Plan:
    """How a replayed request drafts: ``k`` at most; only what will be accepted (``oracle``)."""

    name: str
    k: int
    draft: bool = True
    oracle: bool = False


def replay_request(
    prompt: list[int], output: list[int], pool: OutputPool, lo: int, hi: int, plan: Plan
) -> list[int]:
    """Drafts verified at each of the request's decode steps (its first token comes with the prefill)."""
    index = NgramIndex(lo, hi)
    drafted: list[int] = []
    pos = 1
    while pos < len(output):
        limit = min(plan.k, len(output) - pos - 1) if plan.draft else 0
        tokens = prompt + output[:pos]
        draft = index.propose(tokens, limit)
        if len(draft) < limit:
            draft = draft + pool.propose(tokens[-hi:] + draft, limit - len(draft))
        accepted = accepted_length(draft, output[pos:])
        drafted.append(accepted if plan.oracle else len(draft))
        pos += accepted + 1
    return drafted


def replay(
    outputs: list[tuple[list[int], list[int]]], batch: int, plan: Plan, terms: StepTerms
) -> tuple[int, float]:
    """Decode steps and priced seconds over the static batches, as spec_bench runs them."""
    pool = OutputPool(2, 5, 256, 0.5)
    steps, seconds = 0, 0.0
    for start in range(0, len(outputs), batch):
        group = outputs[start : start + batch]
        traces = []
        for key, (prompt, output) in enumerate(group, start=start):
            traces.append(replay_request(prompt, output, pool, 2, 5, plan))
            pool.extend(key, prompt + output, len(prompt), len(prompt) + len(output))
        for step in range(max((len(t) for t in traces), default=0)):
            live = [t[step] for t in traces if step < len(t)]
            tokens = len(live) + sum(live)
            seconds += terms.time(tokens, tokens)
        steps += max((len(t) for t in traces), default=0)
    return steps, seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="summarize")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed off runs (median)")
    ap.add_argument("--batch-invariant", action="store_true")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    options = {
        "kv_cache_memory_bytes": 256 << 20,
        "quantization": "none",
        "batch_invariant": args.batch_invariant,
    }
    off = LLM("smollm2-135m-instruct", max_num_seqs=64, **options)
    auto = LLM("smollm2-135m-instruct", max_num_seqs=64, speculative_config=MODES["auto"], **options)
    prompts, params = workloads(off)[args.workload]
    prompts, params = prompts[: args.requests], params[: args.requests]
    first = [replace(p, max_tokens=1) for p in params]
    run_cell(auto, prompts, params, args.batch)  # the cost fit, measured in this process
    terms = StepTerms.of(auto.engine.speculator.cost)
    outs = off.generate(prompts, params) if args.batch >= args.requests else []
    if not outs:
        for i in range(0, len(prompts), args.batch):
            outs += off.generate(prompts[i : i + args.batch], params[i : i + args.batch])
    outputs = [(list(o.prompt_token_ids), list(o.token_ids)) for o in outs]
    measured, prefill = [], []
    for _ in range(args.repeats):
        measured.append(run_cell(off, prompts, params, args.batch)[0])
        prefill.append(run_cell(off, prompts, first, args.batch)[0]["cpu_s"])
    measured_cpu = sorted(m["cpu_s"] for m in measured)[len(measured) // 2]
    prefill_cpu = sorted(prefill)[len(prefill) // 2]
    plans = [Plan("off", 0, draft=False), Plan("every proposal, k=4", 4), Plan("every proposal, k=8", 8)]
    plans += [Plan("oracle, k=8", 8, oracle=True), Plan("oracle, any k", 1 << 20, oracle=True)]
    rows = []
    base = None
    for plan in plans:
        steps, seconds = replay(outputs, args.batch, plan, terms)
        total = prefill_cpu + seconds
        base = base or total
        rows.append({"plan": plan.name, "steps": steps, "priced_cpu_s": total, "vs_off": base / total})
    print(
        f"step cost fit: fixed {terms.fixed * 1e3:.2f} ms, per token {terms.per_token * 1e3:.3f} ms, "
        f"per row {terms.per_row * 1e3:.3f} ms; prefill {prefill_cpu:.3f} CPU-s; off measured "
        f"{measured_cpu:.3f} CPU-s (median of {args.repeats}), priced {rows[0]['priced_cpu_s']:.3f}; load "
        f"{os.getloadavg()[0]:.2f}"
    )
    print("| plan | decode steps | priced CPU-s | vs off |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['plan']} | {r['steps']} | {r['priced_cpu_s']:.3f} | {r['vs_off']:.2f}x |")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "terms": vars(terms),
                    "prefill_cpu_s": prefill_cpu,
                    "off_measured_cpu_s": measured_cpu,
                    "rows": rows,
                    "torch": torch.__version__,
                    "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()

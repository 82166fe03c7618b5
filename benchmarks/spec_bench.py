"""Speculative decoding on the CPU: speculation off vs n-gram (k=4) vs n-gram auto, interleaved.

Embedded SmolLM2-135M, one thread, greedy. Workloads (all through the chat template):
- summarize: the demo reviews (then benchmarks/data/reviews.jsonl) with configs/jobs/summarize.yaml's prompt;
- extract: the same texts with configs/jobs/extract.yaml's prompt and JSON schema (structured outputs);
- varied: chat prompts of several kinds (questions, rewrites, replies) over tickets and news.
Batch b runs b requests at once (b=1: requests one after another). Each engine runs the cell once
untimed, then the modes alternate A B C, B C A, C A B ... in one process (one engine per mode, loaded
once); each cell reports min and median over the repeats of output
tokens per process CPU-second and per wall second, with acceptance, mean accepted length and tokens per
step. Outputs must equal speculation-off's (checked). Run:

    PYTHONPATH=. python3 benchmarks/spec_bench.py --repeats 2 --out benchmarks/results/spec_cpu.json

GPU (owed, benchmarks/gpu_check.sh): the 8B shape with the 1B preset as draft at batch 1/16/256,
``--model llama-3.1-8b --draft llama-3.2-1b --device cuda --batches 1,16,256 --per-batch 1:2,16:16,256:256``
(random weights: acceptance says nothing there; the check is that ``auto`` never loses and what a
verification step costs next to a decode step on the GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
import yaml

from prefixflow.engine import LLM, SamplingParams, StructuredOutputs

ROOT = Path(os.environ.get("PREFIXFLOW_ROOT") or Path(__file__).resolve().parents[1])
MODES = {
    "off": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5},
    "auto": {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5},
    # auto with the request's own lookup only (no drafts from other requests' outputs)
    "auto-local": {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5, "cross_request": False},
    # the lookup alone, without grammar-forced drafts (what extraction got before jump-forward)
    "auto-nojf": {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5, "jump_forward": False},
    # k=4 with forced drafts in the tokenizer's own split, not the target's learned one (before issue 27 item 1)
    "ngram-canon": {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
    },
}
CANONICAL_SPLIT = {"ngram-canon"}  # modes whose forced drafts do not learn the target's split
MODES["auto-shared-ties"] = MODES["auto"]  # patched below: a predicted tie for last always shared
MODES["off-twin"] = None  # a second engine with speculation off: this host's noise floor between twins
SHARED_TIES = {"auto-shared-ties"}


def time_speculator(llm: LLM) -> None:
    """Count the process CPU-seconds the speculator itself spends (proposing, the policy, the cost
    model's update) into ``llm.spec_cpu_s``: the overhead that ``auto`` pays even where it drafts nothing."""
    spec = llm.engine.speculator
    llm.spec_cpu_s = 0.0  # type: ignore[attr-defined]
    if spec is None:
        return
    for name in ("propose", "observe"):
        inner = getattr(spec, name)

        def timed(*a, _inner=inner, **kw):
            t = time.process_time()
            try:
                return _inner(*a, **kw)
            finally:
                llm.spec_cpu_s += time.process_time() - t  # type: ignore[attr-defined]

        setattr(spec, name, timed)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def texts() -> list[str]:
    demo = jsonl(ROOT / "pipeline" / "data" / "demo_reviews.jsonl")
    more = jsonl(ROOT / "benchmarks" / "data" / "reviews.jsonl")
    return [r["text"] for r in demo] + [r["text"] for r in more]


def workloads(llm: LLM) -> dict[str, tuple[list[str], list[SamplingParams]]]:
    summ = yaml.safe_load((ROOT / "configs" / "jobs" / "summarize.yaml").read_text())
    extr = yaml.safe_load((ROOT / "configs" / "jobs" / "extract.yaml").read_text())

    def chat(system: str | None, user: str) -> str:
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}
        ]
        return llm.apply_chat_template(msgs)

    docs = texts()
    summarize = [
        chat(summ["system_prompt"], summ["template"].replace("{{ document }}", t).strip()) for t in docs
    ]
    extract = [chat(None, extr["template"].replace("{{ text }}", t).strip()) for t in docs]
    tickets = [r["text"] for r in jsonl(ROOT / "benchmarks" / "data" / "tickets.jsonl")]
    news = [r["text"] for r in jsonl(ROOT / "benchmarks" / "data" / "news.jsonl")]
    asks = [
        "Write a short, polite reply to this customer message: {}",
        "What is the main problem here? {}",
        "Rewrite this more formally: {}",
        "Give three keywords for: {}",
    ]
    varied = [chat(None, asks[i % len(asks)].format(t)) for i, t in enumerate(tickets)]
    varied += [chat(None, f"Explain this news in simple words: {t}") for t in news]
    greedy = SamplingParams(temperature=0.0, max_tokens=summ["sampling"]["max_tokens"])
    schema = StructuredOutputs(json_schema=extr["schema"])
    structured = SamplingParams(temperature=0.0, max_tokens=extr["sampling"]["max_tokens"], structured=schema)
    return {
        "summarize": (summarize, [greedy] * len(summarize)),
        "extract": (extract, [structured] * len(extract)),
        "varied": (varied, [SamplingParams(temperature=0.0, max_tokens=96)] * len(varied)),
    }


def counters(llm: LLM) -> dict[str, float]:
    """Engine counters; drafts summed over kinds (the method's and grammar-forced ``jump_forward``),
    the forced ones also apart."""
    s = llm.stats()
    kinds = s.speculation
    forced = kinds.get("jump_forward", {})
    return {
        "spec_cpu_s": getattr(llm, "spec_cpu_s", 0.0),
        "steps": s.steps,
        "out": s.output_tokens,
        "proposed": sum(v.get("proposed", 0) for v in kinds.values()),
        "accepted": sum(v.get("accepted", 0) for v in kinds.values()),
        "forced_proposed": forced.get("proposed", 0),
        "forced_accepted": forced.get("accepted", 0),
    }


def run_cell(llm: LLM, prompts: list[str], params: list[SamplingParams], batch: int) -> tuple[dict, list]:
    spec = llm.engine.speculator
    if spec is not None and spec.pool is not None:  # repeats run the same rows: no memory of them
        spec.pool.counts.clear()
        spec.pool.requests.clear()
    before = counters(llm)
    wall, cpu = time.perf_counter(), time.process_time()
    outs = []
    for i in range(0, len(prompts), batch):
        outs += llm.generate(prompts[i : i + batch], params[i : i + batch])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = counters(llm)
    d = {k: after[k] - before[k] for k in after}
    d.update(wall_s=wall, cpu_s=cpu)
    return d, [o.token_ids for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--per-batch", default="1:3,8:8,64:64", help="batch:requests per cell")
    ap.add_argument("--workloads", default="summarize,extract,varied")
    ap.add_argument("--cap", default="", help="batch:max_tokens caps, e.g. 64:24 (a loaded host)")
    ap.add_argument("--out", default="benchmarks/results/spec_cpu.json")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--draft", default=None, help="also run draft_model (k=4) and draft_model auto with this draft"
    )
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument(
        "--batch-invariant",
        action="store_true",
        help="every engine with batch_invariant=True (bf16 hosts: verification rows then round as decode rows)",
    )
    ap.add_argument("--dtype", default="auto", help="the engines' dtype (float32: identical by construction)")
    ap.add_argument("--modes", default="off,ngram,auto", help=f"of {', '.join(MODES)}; off always runs first")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    modes = {m: MODES[m] for m in ["off"] + [m for m in args.modes.split(",") if m != "off"]}
    if args.draft:
        modes["draft"] = {"method": "draft_model", "model": args.draft, "num_speculative_tokens": 4}
        modes["draft-auto"] = {"method": "draft_model", "model": args.draft}
    memory = {"kv_cache_memory_bytes": 256 << 20, "quantization": "none"} if args.device == "cpu" else {}
    options = {**memory, "batch_invariant": True} if args.batch_invariant else memory
    options = {**options, "dtype": args.dtype}
    engines = {
        m: LLM(
            args.model, device=args.device, max_num_seqs=args.max_num_seqs, speculative_config=spec, **options
        )
        for m, spec in modes.items()
    }
    for mode, llm in engines.items():
        time_speculator(llm)
        if mode in CANONICAL_SPLIT and llm.engine.speculator is not None:
            llm.engine.speculator.forced.token_bytes = None
        if mode in SHARED_TIES and llm.engine.speculator is not None:
            llm.engine.speculator.tie_prior_stops = float("inf")
    loads = workloads(engines["off"])
    per = dict(tuple(int(x) for x in p.split(":")) for p in args.per_batch.split(","))
    results: dict = {}
    for name in args.workloads.split(","):
        prompts, params = loads[name]
        for batch in (int(b) for b in args.batches.split(",")):
            n = per[batch]
            caps = dict(tuple(int(x) for x in c.split(":")) for c in args.cap.split(",") if c)
            cell_params = [
                replace(p, max_tokens=min(p.max_tokens or caps[batch], caps[batch])) if batch in caps else p
                for p in params[:n]
            ]
            cell: dict = {m: [] for m in modes}
            # one untimed run per engine: every prefix cache equally warm; off's tokens are the reference
            reference = {m: run_cell(engines[m], prompts[:n], cell_params, batch)[1] for m in modes}["off"]
            order = list(modes)
            for rep in range(args.repeats):
                # A B C, then B C A, ...: a drift within a repeat must not always fall on the same mode
                for mode in order[rep % len(order) :] + order[: rep % len(order)]:
                    stats, tokens = run_cell(engines[mode], prompts[:n], cell_params, batch)
                    stats["identical"] = tokens == reference
                    cell[mode].append(stats)
                    print(
                        name,
                        batch,
                        rep,
                        mode,
                        {k: round(v, 3) if isinstance(v, float) else v for k, v in stats.items()},
                        f"load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
            results[f"{name}/b{batch}"] = cell
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(
                json.dumps(
                    {
                        "results": results,
                        "load": os.getloadavg(),
                        "torch": torch.__version__,
                        "threads": 1,
                        "args": vars(args),
                    },
                    indent=1,
                )
            )
    print(table(results))


def table(results: dict) -> str:
    rows = [
        "| workload | batch | mode | out tok / CPU-s (min, median) | out tok / wall-s (median) | vs off (CPU, median) "
        "| acceptance | forced acceptance (share of drafts) | steps | tokens / step | speculator CPU share | identical |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, cell in results.items():
        name, batch = key.split("/b")
        base = statistics.median(r["out"] / r["cpu_s"] for r in cell["off"])
        for mode, reps in cell.items():
            cpu = [r["out"] / r["cpu_s"] for r in reps]
            wall = [r["out"] / r["wall_s"] for r in reps]
            r0 = reps[0]
            acc = r0["accepted"] / r0["proposed"] if r0["proposed"] else 0.0
            fp = r0.get("forced_proposed", 0)
            forced = f"{r0.get('forced_accepted', 0) / fp:.2f} ({fp / r0['proposed']:.2f})" if fp else "-"
            rows.append(
                f"| {name} | {batch} | {mode} | {min(cpu):.1f}, {statistics.median(cpu):.1f} | "
                f"{statistics.median(wall):.1f} | {statistics.median(cpu) / base:.2f}x | {acc:.2f} | "
                f"{forced} | {r0['steps']} | {r0['out'] / r0['steps']:.2f} | "
                f"{sum(r.get('spec_cpu_s', 0.0) for r in reps) / sum(r['cpu_s'] for r in reps):.1%} | "
                f"{all(r['identical'] for r in reps)} |"
            )
    return "\n".join(rows)


if __name__ == "__main__":
    main()

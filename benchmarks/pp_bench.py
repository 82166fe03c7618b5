"""Pipeline vs tensor parallelism vs one engine per core, on the CPU (issue 29).

    python -m benchmarks.pp_bench --repeats 2 --json benchmarks/results/cpu_pp_bench.json
    python -m benchmarks.pp_bench --model llama-3.1-8b --device cuda --dtype bfloat16 ...   # 2 GPUs (gpu_pp_check.sh)

Three ways to spend two cores (or GPUs) on one model, one torch thread per process each on the CPU.
The CPU default model is SmolLM2-135M's shape with 8 query / 4 KV heads instead of 9 / 3 (random
weights, float32, 30 layers, tied 49,152-word head): the real SmolLM2's 9 heads cannot split over
two TP ranks, which PP does not mind. PP splits it 19/11 (its 28 M-parameter head sits on the
last stage).
- ``pp2``: ``pipeline_parallel_size=2`` (two ranks, gloo send/recv), its default two virtual engines:
  a step of each lane in flight, so the stages overlap across step boundaries;
- ``pp2v1``: the same with ``pipeline_virtual_engines=1``: one scheduler, each step cut into two
  micro-batches that fill and drain the pipeline (the design before; the bubble's "before");
- ``tp2``: ``tensor_parallel_size=2`` (two ranks, 61 gloo all-reduces per step);
- ``dp2``: two independent engines (subprocesses), each on half the prompts, run at the same time;
- ``one``: one engine, one thread, all the prompts (the baseline the other three spend 2 cores beating).
Runs alternate pp2 tp2 dp2 pp2 tp2 dp2 ..., each on a freshly loaded engine. Reported per run: output
tok/s over the generate call (wall, the slower process for dp2), process CPU-seconds of every rank
(``/proc`` utime + stime of the workers plus this process), steps, bytes sent between processes per
step (pp2: measured by the pipeline; tp2: the all-reduced payload, (2 x layers + 1) x tokens x hidden
x 4 bytes, plus the logits gather), and for pp2 the bubble two ways: ``wait``, the share of each
stage's compute + wait time spent waiting for the other's activations (or, on rank 0, for the
logits), the figure measured before; and ``idle``, 1 - the stage's compute time / the generate
call's wall time, which also counts a worker waiting for its next command and rank 0 sampling and
scheduling (the whole bubble, the one that matters).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

import torch

from benchmarks.common import environment, print_table, write_json

MODEL = "smollm2-shape"
SMOLLM2_SHAPE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 72,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}


def model_dir(name: str) -> str:
    """A preset's HF directory, or the SmolLM2-shaped random model (built once in the cache)."""
    from prefixflow.engine.loading import presets

    if name != MODEL:
        return str(presets.materialize(name))
    out = presets.cache_dir() / "bench" / "smollm2-shape-8h"
    if not (out / "config.json").exists():
        presets.save_random_model(SMOLLM2_SHAPE, out, seed=0)
    return str(out)


COLUMNS = [
    "run",
    "mode",
    "output_tok_s",
    "elapsed_s",
    "cpu_s",
    "steps",
    "bytes_per_step",
    "bubble_rank0",
    "bubble_rank1",
    "idle_rank0",
    "idle_rank1",
    "max_in_flight",
]

SIZES = {
    "pp2": {"pipeline_parallel_size": 2},
    "pp2v1": {"pipeline_parallel_size": 2, "pipeline_virtual_engines": 1},
    "tp2": {"tensor_parallel_size": 2},
    "one": {},
}


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(n)]


def cpu_of(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (FileNotFoundError, IndexError):
            pass
    return total


def engine_run(model: str, mode: str, work: list[list[int]], max_tokens: int, options: dict) -> dict:
    from prefixflow.engine import LLM, SamplingParams

    if options["device"] == "cpu":
        torch.set_num_threads(1)
    with LLM(model, **SIZES[mode], **options) as llm:
        runner = llm.engine.runner
        llm.generate(work[:1], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up (untimed)
        pids = runner.pool.pids if runner.pool is not None else []
        steps0, pp0 = llm.stats().steps, runner.pipeline_stats()
        cpu0, t0 = time.process_time() + cpu_of(pids), time.perf_counter()
        outs = llm.generate(work, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() + cpu_of(pids) - cpu0
        steps = llm.stats().steps - steps0
        out_tokens = sum(o.num_output_tokens for o in outs)
        row = {
            "mode": mode,
            "output_tokens": out_tokens,
            "elapsed_s": elapsed,
            "output_tok_s": out_tokens / elapsed,
            "cpu_s": cpu,
            "steps": steps,
            "bubble_rank0": None,
            "bubble_rank1": None,
            "idle_rank0": None,
            "idle_rank1": None,
            "max_in_flight": None,
        }
        cfg = llm.engine.model_cfg
        if mode.startswith("pp"):
            d = (runner.pipeline_stats() - pp0).numpy()  # per rank: compute s, wait s, bytes sent, steps
            row["bytes_per_step"] = float(d[:, 2].sum()) / steps
            for rank in (0, 1):
                row[f"bubble_rank{rank}"] = float(d[rank, 1] / (d[rank, 0] + d[rank, 1]))
                row[f"idle_rank{rank}"] = float(1 - d[rank, 0] / elapsed)
            row["max_in_flight"] = runner.in_flight.max_in_flight if runner.in_flight is not None else 1
        elif mode == "one":
            row["bytes_per_step"] = 0.0
        else:
            tokens = sum(len(p) for p in work) + out_tokens
            reduce = (2 * cfg.num_layers + 1) * tokens * cfg.hidden_size * 4
            gather = out_tokens * cfg.vocab_size * 4 / 2  # rank 1's half of the vocabulary per sampled row
            row["bytes_per_step"] = (reduce + gather) / steps
    return row


def child(args: argparse.Namespace) -> None:
    """One engine of dp2 (its own process, one thread): waits for the start file, then generates."""
    from prefixflow.engine import LLM, SamplingParams

    torch.set_num_threads(1)
    work = prompts(args.num_prompts, args.prompt_len, seed=0)[args.part :: 2]
    llm = LLM(args.model, **json.loads(args.options))
    llm.generate(work[:1], SamplingParams(max_tokens=2, ignore_eos=True))
    print("ready", flush=True)
    sys.stdin.readline()
    cpu0, t0 = time.process_time(), time.perf_counter()
    outs = llm.generate(work, SamplingParams(max_tokens=args.max_tokens, ignore_eos=True))
    print(
        json.dumps(
            {
                "elapsed_s": time.perf_counter() - t0,
                "cpu_s": time.process_time() - cpu0,
                "output_tokens": sum(o.num_output_tokens for o in outs),
                "steps": llm.stats().steps,
            }
        ),
        flush=True,
    )


def dp_run(args: argparse.Namespace, model: str, options: dict) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.pp_bench",
        "--child",
        "--model",
        model,
        "--num-prompts",
        str(args.num_prompts),
        "--prompt-len",
        str(args.prompt_len),
        "--max-tokens",
        str(args.max_tokens),
        "--options",
        json.dumps(options),
    ]
    env = [
        dict(os.environ, **({"CUDA_VISIBLE_DEVICES": str(i)} if args.device == "cuda" else {}))
        for i in (0, 1)
    ]
    procs = [
        subprocess.Popen(
            [*cmd, "--part", str(i)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env[i]
        )
        for i in (0, 1)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        results.append(json.loads(out.strip().splitlines()[-1]))
    elapsed = max(r["elapsed_s"] for r in results)
    tokens = sum(r["output_tokens"] for r in results)
    return {
        "mode": "dp2",
        "output_tokens": tokens,
        "elapsed_s": elapsed,
        "output_tok_s": tokens / elapsed,
        "cpu_s": sum(r["cpu_s"] for r in results),
        "steps": max(r["steps"] for r in results),
        "bytes_per_step": 0.0,
        "bubble_rank0": None,
        "bubble_rank1": None,
        "idle_rank0": None,
        "idle_rank1": None,
        "max_in_flight": None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=MODEL, help="a preset name, or smollm2-shape (the CPU default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="pp2v1,pp2,tp2,dp2,one")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--part", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    options = {
        "dtype": args.dtype,
        "device": args.device,
        "max_num_seqs": args.num_prompts,
        "enable_prefix_caching": False,
    }
    if args.device == "cpu":
        options["kv_cache_memory_bytes"] = 128 * 2**20
    model = model_dir(args.model)
    work = prompts(args.num_prompts, args.prompt_len, seed=0)
    rows, loads = [], []
    for i in range(args.repeats):
        for mode in args.modes.split(","):
            loads.append(os.getloadavg()[0])
            row = (
                dp_run(args, model, options)
                if mode == "dp2"
                else engine_run(model, mode, work, args.max_tokens, options)
            )
            rows.append({"run": f"{i + 1}{mode}", **row})
            print_table(rows[-1:], COLUMNS)
            sys.stdout.flush()
    summary = {}
    for mode in args.modes.split(","):
        mine = [r for r in rows if r["mode"] == mode]
        rates = [r["output_tok_s"] for r in mine]
        summary[mode] = {
            "output_tok_s_min": min(rates),
            "output_tok_s_median": statistics.median(rates),
            "cpu_s_median": statistics.median(r["cpu_s"] for r in mine),
            "bytes_per_step_median": statistics.median(r["bytes_per_step"] for r in mine),
        }
        summary[mode]["cpu_s_min"] = min(r["cpu_s"] for r in mine)
        summary[mode]["elapsed_s_median"] = statistics.median(r["elapsed_s"] for r in mine)
        if mode.startswith("pp"):
            for kind in ("bubble", "idle"):
                summary[mode][f"{kind}_median"] = [
                    statistics.median(r[f"{kind}_rank{k}"] for r in mine) for k in (0, 1)
                ]
    print_table(rows, COLUMNS, title=f"{args.model}: PP=2 vs TP=2 vs one engine per device ({args.device})")
    print(json.dumps(summary, indent=1), f"\nload average per run: {loads}")
    write_json(
        args.json,
        {
            "benchmark": "pp_bench",
            "args": vars(args),
            "environment": environment(),
            "rows": rows,
            "summary": summary,
            "load_average_per_run": loads,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

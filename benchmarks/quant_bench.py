"""Quantized weights side by side (issue 12): output tok/s at batch 1/16/64 and weight bytes, per method.

Every variant is loaded once; rounds are interleaved (A B C, A B C, ...) so load from other processes
hits all of them alike; min and median over rounds are reported with the load average.

    python -m benchmarks.quant_bench --model smollm2-135m-instruct --variants none,gguf,int8,int4
    python -m benchmarks.quant_bench --model llama-3.2-1b --dtype bfloat16 --variants none,int8,int4 \
        --batches 1,16,64 --max-tokens 8

``--model``: the embedded SmolLM2 (GGUF), an HF directory, or a preset (random weights built in memory,
as benchmarks/common.py does). Variants: ``none`` (full precision: GGUF blocks dequantized), ``gguf``
(the file's own Q4_1/Q8_0/Q4_0 blocks kept packed), ``int8``/``int4``/``fp8`` (on the fly), or any of
these with ``+loop`` (the per-request torch attention instead of the batched CPU path).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import time
from typing import Any

from benchmarks.common import environment, print_table, setup_threads, write_json

COLUMNS = [
    "variant",
    "batch",
    "output_tokens",
    "tok_s_min_round",
    "tok_s_median",
    "tok_s_best",
    "weight_bytes",
    "linear_kernels",
]


def load(model: str, variant: str, dtype: str, kv_bytes: int, bench_model: Any = None) -> Any:
    from prefixflow.engine import LLM
    from prefixflow.kernels import reference

    method, _, attention = variant.partition("+")
    quantization = {"none": "none"}.get(method, method)  # "gguf": the file's blocks kept packed
    source: Any = model
    if bench_model is not None:
        from benchmarks.common import model_source

        source = model_source(bench_model)
    llm = LLM(source, dtype=dtype, device="cpu", quantization=quantization, kv_cache_memory_bytes=kv_bytes)
    if attention == "loop":  # the per-request reference path, for comparison
        backend = llm.engine.runner.shard.attention
        backend.ops = dataclasses.replace(backend.ops, paged_attention=reference.paged_attention)
    return llm


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(n)]


def run_once(llm: Any, batch: int, prompt_len: int, max_tokens: int, seed: int) -> tuple[int, float]:
    from prefixflow.engine import SamplingParams

    before = llm.stats()
    out0, t0 = before.output_tokens, before.elapsed_s
    vocab = llm.engine.model_cfg.vocab_size
    llm.generate(
        prompts(batch, prompt_len, vocab, seed), SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    )
    after = llm.stats()
    return after.output_tokens - out0, after.elapsed_s - t0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--variants", default="none,int8,int4")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kv-bytes", type=int, default=256 << 20)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default 1: a shared host)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    setup_threads(args.threads, "cpu")
    variants = args.variants.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    bench_model = None
    from prefixflow.engine.loading.presets import available_presets

    if args.model in available_presets():
        from benchmarks.common import build_model

        bench_model = build_model(args.model, device="cpu", dtype=args.dtype)
    env = environment()
    load_before = os.getloadavg()
    llms: dict[str, Any] = {}
    load_s: dict[str, float] = {}
    for v in variants:
        t = time.perf_counter()
        llms[v] = load(args.model, v, args.dtype, args.kv_bytes, bench_model)
        load_s[v] = time.perf_counter() - t
        run_once(llms[v], 2, 8, 2, seed=99)  # warm-up
    speeds: dict[tuple[str, int], list[float]] = {(v, b): [] for v in variants for b in batches}
    tokens: dict[tuple[str, int], int] = {}
    for r in range(args.rounds):
        for b in batches:
            for v in variants:
                n, secs = run_once(llms[v], b, args.prompt_len, args.max_tokens, seed=r)
                speeds[(v, b)].append(n / secs)
                tokens[(v, b)] = n
                print(f"round {r} {v:12s} batch {b:3d}: {n / secs:8.1f} tok/s ({secs:.1f} s)", flush=True)
    from prefixflow.engine.quantization.report import linear_kernels

    rows = []
    for v in variants:
        kernels = linear_kernels(llms[v].engine.runner.shard.model)
        for b in batches:
            s = speeds[(v, b)]
            rows.append(
                {
                    "variant": v,
                    "batch": b,
                    "output_tokens": tokens[(v, b)],
                    "tok_s_min_round": round(min(s), 2),
                    "tok_s_median": round(statistics.median(s), 2),
                    "tok_s_best": round(max(s), 2),
                    "weight_bytes": llms[v].stats().weight_bytes,
                    "linear_kernels": kernels,
                }
            )
    print_table(rows, COLUMNS)
    result = {
        "benchmark": "quant_bench",
        "model": args.model,
        "dtype": args.dtype,
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "rows": rows,
        "load_s": load_s,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "environment": env,
    }
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

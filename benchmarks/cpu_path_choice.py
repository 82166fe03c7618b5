"""Which weight path is fastest for the embedded SmolLM2 on this CPU (issue 24): the measurement behind
engine/quantization/weight_path.py's rule.

Four paths loaded once: packed float32 (the Q4_1 blocks, ``cpu-dequant``), dense float32, dense bf16,
packed bf16 (torch's int4 pack op). Per batch, 2 rounds interleaved A B C D, A B C D; ``batch``
random prompts of 128 tokens, 32 new tokens, greedy, EOS ignored, prefix caching off; process
CPU-seconds (``time.process_time``) beside wall time; the load average at the end.

    python benchmarks/cpu_path_choice.py THREADS BATCHES    # e.g. 1 1,16,64

(The run in benchmarks/results/cpu_path_choice.log predates ``quantization="gguf"``: its packed
paths were then the default, ``quantization=None``; the code is otherwise this file.)
"""

import os
import random
import sys
import time

import torch

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
from prefixflow.engine import LLM, SamplingParams  # noqa: E402

variants = {
    "packed-f32": ("float32", "gguf"),
    "dense-f32": ("float32", "none"),
    "dense-bf16": ("bfloat16", "none"),
    "packed-bf16": ("bfloat16", "gguf"),
}
llms = {}
for k, (dt, q) in variants.items():
    llms[k] = LLM(
        "smollm2-135m-instruct",
        dtype=dt,
        device="cpu",
        quantization=q,
        kv_cache_memory_bytes=256 << 20,
        enable_prefix_caching=False,
    )
    llms[k].generate([[5] * 8] * 2, SamplingParams(max_tokens=2, ignore_eos=True))
rng = random.Random(0)
for b in [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,16,64").split(",")]:
    ps = [[rng.randrange(10, 49000) for _ in range(128)] for _ in range(b)]
    for r in range(2):
        for k, llm in llms.items():
            c0, w0 = time.process_time(), time.perf_counter()
            llm.generate(ps, SamplingParams(max_tokens=32, ignore_eos=True))
            c, w = time.process_time() - c0, time.perf_counter() - w0
            print(
                f"b{b} r{r} {k:12s} cpu {c:6.2f}s wall {w:6.2f}s  tot-tok/cpu-s {b * 160 / c:7.1f} out/cpu-s {b * 32 / c:6.1f}",
                flush=True,
            )
print(os.getloadavg())

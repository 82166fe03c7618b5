"""The CPU path every newcomer runs (issue 24): the embedded SmolLM2 GGUF, engine paths and peers side by side.

Per (threads, batch), rounds interleaved (A B C ..., A B C ...): ``batch`` random prompts of
``--prompt-len`` tokens, ``--max-tokens`` new tokens each, greedy, EOS ignored, prefix caching off.
Every run records wall seconds and **process CPU-seconds** (``time.process_time``; for llama.cpp the
child's rusage), so that load from other processes on a shared host cancels out as far as it can;
tokens = prompt + generated. The CPU matmul ceiling (benchmarks/roofline.py) is measured per thread
count in the same run, in float32 and bf16, and the faster counts (on a native-bf16 CPU bf16 is about
2x float32); ``ceiling_frac`` = model FLOPs of the run / wall / ceiling.

Engines (``--engines``):
- ``pf-default``: ``LLM("smollm2-135m-instruct")`` as a newcomer gets it (describe_model says the path
  and the dtype: bf16 on a CPU with native bf16, else float32);
- ``pf-float32``: ``dtype="float32"`` (dense float32);
- ``pf-packed``: ``quantization="gguf"`` (the Q4_1 blocks kept packed, float32 activations);
- ``pf-bf16``: ``dtype="bfloat16"`` (dense on a CPU with native bf16, else packed);
- ``pf-packed-bf16``: ``dtype="bfloat16", quantization="gguf"`` (torch's int4 pack matmul);
- ``pf-unchunked``: the default with kernels/cpu_linear.py's column chunks of wide layers turned off;
- ``pf-sdpa-decode``: the default with every attention chunk on torch's SDPA (before the single-query
  path of kernels/cpu_attention.py);
- ``pf-math-decode``: the default with bf16 decodes on the two-matmul path even on a CPU with AMX tiles
  (before kernels/cpu_attention.py ``_sdpa_decodes``);
- ``pf-padded-chunks``: the default with attention chunks cut by the K/V and mask budgets only (before
  the padding rule of kernels/cpu_attention.py ``_split``: decodes no longer pad to a prefill's query rows);
- ``pf-all-heads``: the default with decode matmuls over all KV heads at once (before the per-head path
  of kernels/cpu_attention.py, which reads K and V in place);
- ``pf-torch-attention``: the default with every step's attention on kernels/cpu_attention.py (before
  the native row kernel of kernels/cpu_row_attention.py); the four variants above run with it off too;
  ``pf-rows-on-amx``: the default with steps of queries up to 16 rows on the row kernel on a CPU with AMX
  tiles too (the default keeps SDPA there until this is measured); ``pf-rows-on-avx2``: every step on the
  row kernel on an AVX2-only CPU, float32 caches included (the default there since the sixteenth round;
  ``pf-torch-attention`` is the other side);
  ``pf-float32-torch-attention`` / ``pf-float32-rows``: ``pf-float32`` with the row kernel off / on (the
  runs below were made while float32 caches took it by default, so there ``pf-float32`` is the row kernel). An AVX2 host emulated on an AVX-512 one (what decided ``AVX2_ROWS``):
  ``MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
  PREFIXFLOW_NATIVE_MARCH=haswell python -m benchmarks.cpu_path --engines
  pf-float32-rows,pf-float32-torch-attention --threads 1 --batches 1,16,64``;
- ``pf-float32-dense``: float32 with every product on the dense matmul (``quantization="none"``: the
  float32 default before the native matvec of kernels/cpu_gguf_matvec.py); ``pf-matvec-8``, ``-16``,
  ``-32``, ``-64``: the default with float32 products of up to that many rows on that matvec (the default:
  64; 16 before the sixteenth round); ``pf-dense-head``: the
  default with the tied LM head dense (not its Q8_0 blocks). An AVX2 host emulated (the ISA limits make
  ``dtype="auto"`` float32, kernels/cpu_features.py): ``MKL_ENABLE_INSTRUCTIONS=AVX2
  ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 PREFIXFLOW_NATIVE_MARCH=haswell python -m
  benchmarks.cpu_path --engines pf-default,pf-dense-head,pf-float32-dense,hf --threads 1,2 --batches
  1,16,64``;
- ``pf-attention-base``: the default with the native row attention kernel as of ``--attention-base REV``
  (kernels/native/paged_attention.c from git, built with the engine's flags): an end-to-end A/B of a
  change to that kernel;
- ``pf-torch-elementwise``: the default with norm, rotary and SiLU-and-mul on kernels/cpu_ops.py's torch
  calls and the KV store on kernels/reference.py's (before the native calls of kernels/cpu_native_ops.py);
- ``pf-int8``: ``cpu_int8="on"`` (int8 w8a8 linear layers, kernels/cpu_int8.py; LM head float32);
  ``pf-int8-head``: the same with the tied LM head in int8 too; ``pf-fp32mm``: ``cpu_int8="off"``;
- ``hf``: transformers ``generate`` on the same GGUF (dequantized to float32), one static batch;
  ``hf-bf16``: the same model cast to bf16 (transformers' faster configuration on a native-bf16 CPU);
- ``llama.cpp``: ``llama-batched-bench`` built by benchmarks/build_llama_cpp.sh (same GGUF, same
  threads, ``-npp P -ntg G -npl B``, every sequence its own prompt). Its wall time is its own timed
  part; its CPU-seconds are the child process's minus those of a 1-token run (model load, warm-up).

    python -m benchmarks.cpu_path --threads 1,2 --batches 1,16,64 --json benchmarks/results/cpu_path.json

``--workload varied`` or ``chat`` (goal 2's 1.6x): the same engines on benchmarks/throughput.py's
``varied`` prompts (lengths uniform in ``--min-len``..``--max-len``, outputs too) or
benchmarks/prefix_workloads.py's chat turns (a shared system prompt, growing histories), prefix
caching **on** for prefixflow (its default); transformers in static padded batches of ``--hf-batch``,
sorted by prompt length (its best configuration: least padding). Tokens = real prompt + requested
output tokens, on every side.

    python -m benchmarks.cpu_path --workload chat --engines pf-default,hf --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import environment, print_table, write_json

MODEL = "smollm2-135m-instruct"
KV_TOKEN_BYTES = 30 * 2 * 3 * 64 * 4  # SmolLM2-135M float32: layers x (K, V) x KV heads x head dim
ENGINES = {
    "pf-default": {},
    "pf-float32": {"dtype": "float32"},
    "pf-packed": {"quantization": "gguf"},
    "pf-bf16": {"dtype": "bfloat16"},
    "pf-packed-bf16": {"dtype": "bfloat16", "quantization": "gguf"},
    "pf-unchunked": {},  # the default with kernels/cpu_linear.py's column chunks off (A/B of that rule)
    "pf-int8": {"cpu_int8": "on"},  # int8 w8a8 layers (kernels/cpu_int8.py), LM head float32
    "pf-int8-head": {"cpu_int8": "on"},  # the same with the tied LM head in int8 too
    "pf-fp32mm": {"cpu_int8": "off"},  # float32 matmuls whatever the default
    "pf-sdpa-decode": {},  # the default with decode attention on SDPA (kernels/cpu_attention.py's _MATH_MIN off)
    "pf-all-heads": {},  # the default with decode matmuls over all KV heads (cpu_attention._PER_HEAD_MIN off)
    "pf-math-decode": {},  # the default with bf16 decodes on the two-matmul path even where the CPU has AMX
    "pf-padded-chunks": {},  # the default with attention chunks cut by the K/V and mask budgets only
    "pf-torch-attention": {},  # the default with every step on kernels/cpu_attention.py (no native row kernel)
    "pf-torch-elementwise": {},  # the default with norm, rotary, SiLU and the KV store on torch calls
    "pf-rows-on-amx": {},  # the default with short-query steps on the row kernel on a CPU with AMX tiles too
    "pf-rows-on-avx2": {},  # the row kernel for every step on an AVX2-only CPU (the default there now)
    "pf-float32-torch-attention": {"dtype": "float32"},  # pf-float32 with the row kernel off
    "pf-float32-rows": {"dtype": "float32"},  # pf-float32 with the row kernel on (off by default in float32)
    "pf-float32-dense": {"dtype": "float32", "quantization": "none"},  # float32, every product dense
    "pf-matvec-8": {},  # the default with float32 products of up to 8 rows on the native matvec
    "pf-matvec-16": {},  # ... up to 16 rows (the default of the fifteenth round)
    "pf-matvec-32": {},  # ... up to 32 rows
    "pf-matvec-64": {},  # ... up to 64 rows (the default now)
    "pf-dense-head": {},  # the default with the tied LM head dense in float32 (no Q8_0 blocks)
    "pf-attention-base": {},  # the default with the row attention kernel of --attention-base REV
}
# pf-attention-base: kernels/native/paged_attention.c as of --attention-base, built in main()
BASE_ATTENTION: dict[str, Any] = {}
# the variants of kernels/cpu_attention.py's torch path: the native row kernel is off for their runs
TORCH_ATTENTION = {
    "pf-torch-attention",
    "pf-math-decode",
    "pf-padded-chunks",
    "pf-all-heads",
    "pf-sdpa-decode",
}


def _split_by_budgets_only(
    order: list[int], qlens: list[int], lens: list[int], kv_token_bytes: int
) -> list[list[int]]:
    """kernels/cpu_attention.py's chunk planner before the padding rule (``pf-padded-chunks``): a request
    joins the current chunk whenever the gathered K/V and the mask fit, whatever padding it adds."""
    from prefixflow.kernels import cpu_attention

    chunks: list[list[int]] = []
    q_max = l_max = 0
    for b in order:
        if chunks:
            n, qm, lm = len(chunks[-1]) + 1, max(q_max, qlens[b]), max(l_max, lens[b])
            if (
                n * lm * kv_token_bytes <= cpu_attention._KV_BUDGET
                and n * qm * lm <= cpu_attention._MASK_BUDGET
            ):
                chunks[-1].append(b)
                q_max, l_max = qm, lm
                continue
        chunks.append([b])
        q_max, l_max = qlens[b], lens[b]
    return chunks


@contextlib.contextmanager
def chunking(engine: str) -> Iterator[None]:
    """``pf-unchunked``: every float32 layer one F.linear for the duration of its run; ``pf-sdpa-decode``:
    every attention chunk on SDPA; ``pf-all-heads``: decode matmuls over all KV heads at once;
    ``pf-padded-chunks``: attention chunks cut by the budgets only (before the padding rule);
    ``pf-math-decode``: bf16 decodes on the two-matmul path whatever the CPU; ``pf-torch-attention`` and
    every variant of the torch attention path: the native row kernel off (kernels/cpu_row_attention.py);
    ``pf-torch-elementwise``: norm, rotary, SiLU and the KV store on torch calls (cpu_native_ops off)."""
    from prefixflow.engine.quantization import dual_gguf, int8_path, weight_path
    from prefixflow.kernels import cpu_attention, cpu_linear, cpu_native_ops, cpu_row_attention

    saved, head, math_min = cpu_linear.CHUNK_MIN_OUT, int8_path.INT8_LM_HEAD, cpu_attention._MATH_MIN
    per_head, split, sdpa_decodes = (
        cpu_attention._PER_HEAD_MIN,
        cpu_attention._split,
        cpu_attention._SDPA_DECODES,
    )
    native, amx_rows, avx2_rows = (
        cpu_row_attention.USE_NATIVE,
        cpu_row_attention.AMX_ROWS_MAX_QUERY,
        cpu_row_attention.AVX2_ROWS,
    )
    float32_rows = cpu_row_attention.FLOAT32_ROWS
    row_fn = cpu_row_attention._function()
    if engine == "pf-attention-base":
        cpu_row_attention._fn = BASE_ATTENTION["fn"]
    native_elementwise = cpu_native_ops.USE_NATIVE
    cpu_native_ops.USE_NATIVE = engine != "pf-torch-elementwise" and native_elementwise
    matvec_rows, packed_head = dual_gguf.FLOAT32_PACKED_MAX_ROWS, weight_path.PACKED_HEAD
    if engine.startswith("pf-matvec-"):
        dual_gguf.FLOAT32_PACKED_MAX_ROWS = int(engine.removeprefix("pf-matvec-"))
    weight_path.PACKED_HEAD = engine != "pf-dense-head" and packed_head
    cpu_row_attention.AVX2_ROWS = engine == "pf-rows-on-avx2" or avx2_rows
    cpu_row_attention.FLOAT32_ROWS = engine in ("pf-rows-on-avx2", "pf-float32-rows") or float32_rows
    cpu_row_attention.USE_NATIVE = engine not in TORCH_ATTENTION and native
    if engine == "pf-rows-on-amx":
        cpu_row_attention.AMX_ROWS_MAX_QUERY = 16
    if engine == "pf-math-decode":
        cpu_attention._SDPA_DECODES = False
    if engine == "pf-padded-chunks":
        cpu_attention._split = _split_by_budgets_only
    if engine == "pf-all-heads":
        cpu_attention._PER_HEAD_MIN = 1 << 62
    if engine == "pf-unchunked":
        cpu_linear.CHUNK_MIN_OUT = 1 << 62
    if engine == "pf-sdpa-decode":
        cpu_attention._MATH_MIN = 1 << 62
    int8_path.INT8_LM_HEAD = engine == "pf-int8-head" or head
    try:
        yield
    finally:
        cpu_row_attention._fn = row_fn
        cpu_linear.CHUNK_MIN_OUT, int8_path.INT8_LM_HEAD, cpu_attention._MATH_MIN = saved, head, math_min
        cpu_attention._PER_HEAD_MIN, cpu_attention._split = per_head, split
        cpu_attention._SDPA_DECODES = sdpa_decodes
        cpu_row_attention.USE_NATIVE, cpu_row_attention.AMX_ROWS_MAX_QUERY = native, amx_rows
        cpu_row_attention.AVX2_ROWS, cpu_row_attention.FLOAT32_ROWS = avx2_rows, float32_rows
        cpu_native_ops.USE_NATIVE = native_elementwise
        dual_gguf.FLOAT32_PACKED_MAX_ROWS, weight_path.PACKED_HEAD = matvec_rows, packed_head


def base_attention(rev: str) -> Any:
    """kernels/native/paged_attention.c as of ``rev``, built with the engine's flags (same C signature)."""
    import tempfile

    from benchmarks.row_attention_ab import build
    from prefixflow.kernels import native_build

    src = native_build.SOURCE_DIR / "paged_attention.c"
    root = src.parents[2]
    text = subprocess.run(
        ["git", "show", f"{rev}:{src.relative_to(root).as_posix()}"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return build(text, Path(tempfile.mkdtemp(prefix="pf-attention-base-")), "base")


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(batch)]


def load_pf(name: str, kv_tokens: int = 16 * 160, prefix_caching: bool = False) -> Any:
    """The engine with a KV pool for ``kv_tokens`` float32 tokens (every sequence of a batch at once)."""
    from prefixflow.engine import LLM

    opts: dict[str, Any] = {"dtype": "auto", **ENGINES[name]}
    with chunking(name):  # pf-int8-head: the LM head is packed at load
        return LLM(
            MODEL,
            device="cpu",
            enable_prefix_caching=prefix_caching,
            kv_cache_memory_bytes=kv_tokens * KV_TOKEN_BYTES + (4 << 20),
            **opts,
        )


def run_pf(llm: Any, batch: list[list[int]], max_tokens: int) -> dict[str, float]:
    from prefixflow.engine import SamplingParams

    c, w = time.process_time(), time.perf_counter()
    outs = llm.generate(batch, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    return {"wall_s": wall, "cpu_s": cpu, "output_tokens": sum(len(o.token_ids) for o in outs)}


def load_hf(dtype: torch.dtype = torch.float32) -> Any:
    from transformers import AutoModelForCausalLM

    from prefixflow.engine.loading.embedded import resolve_embedded

    path = resolve_embedded(MODEL)
    assert path is not None
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model = model.to(dtype)
    return model.eval()


def run_hf(model: Any, batch: list[list[int]], max_tokens: int) -> dict[str, float]:
    from transformers import GenerationConfig

    ids = torch.tensor(batch)
    gen = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        eos_token_id=None,
        pad_token_id=0,
    )
    c, w = time.process_time(), time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    return {"wall_s": wall, "cpu_s": cpu, "output_tokens": int(out[:, ids.shape[1] :].numel())}


# --no-repack: on the AMX host of RESULTS.md "Issue 24", llama.cpp's AMX weight repack (GGML_NATIVE
# builds it in) crashed with SIGSEGV in ggml_backend_amx_mul_mat on this Q4_1 file, at any batch.
LLAMA_CPP_FLAGS = tuple(os.environ.get("PREFIXFLOW_LLAMA_CPP_FLAGS", "--no-repack").split())


def llama_cpp_binary() -> str:
    script = Path(__file__).with_name("build_llama_cpp.sh")
    done = subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1]


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_llama_cpp(
    binary: str, threads: int, batch: int, prompt_len: int, max_tokens: int
) -> dict[str, float]:
    from prefixflow.engine.loading.embedded import resolve_embedded

    ctx = batch * (prompt_len + max_tokens) + 16
    cmd = [
        binary,
        "-m",
        str(resolve_embedded(MODEL)),
        "-c",
        str(ctx),
        "-b",
        "2048",
        "-ub",
        "512",
        "-npp",
        str(prompt_len),
        "-ntg",
        str(max_tokens),
        "-npl",
        str(batch),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "--output-format",
        "jsonl",
        *LLAMA_CPP_FLAGS,
    ]
    c = _child_cpu()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    cpu = _child_cpu() - c
    rows = [
        json.loads(line)
        for line in (done.stdout + done.stderr).splitlines()
        if line.startswith('{"n_kv_max"')
    ]
    if not rows:
        raise RuntimeError(f"llama-batched-bench printed no result:\n{done.stderr[-2000:]}")
    row = rows[-1]
    return {"wall_s": float(row["t"]), "cpu_s": cpu, "output_tokens": batch * max_tokens}


def matmul_flops(prompt_len: int, max_tokens: int, batch: int) -> float:
    """2 x linear parameters per token (prompt and generated) + the LM head per sampled token."""
    from prefixflow.engine.gguf.header import gguf_tensor_table
    from prefixflow.engine.loading.embedded import resolve_embedded

    path = resolve_embedded(MODEL)
    assert path is not None
    linear = vocab_params = 0
    for name, dims, _ in gguf_tensor_table(path):
        n = 1
        for d in dims:
            n *= d
        if name.startswith("blk.") and name.endswith(".weight") and len(dims) == 2:
            linear += n
        elif name == "token_embd.weight":
            vocab_params = n
    return 2.0 * batch * (linear * (prompt_len + max_tokens) + vocab_params * max_tokens)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="pf-default,pf-packed,pf-bf16,hf,llama.cpp")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--workload", default="fixed", choices=["fixed", "varied", "chat"])
    ap.add_argument("--num-prompts", type=int, default=32, help="varied")
    ap.add_argument("--min-len", type=int, default=32, help="varied")
    ap.add_argument("--max-len", type=int, default=192, help="varied")
    ap.add_argument("--conversations", type=int, default=8, help="chat")
    ap.add_argument("--turns", type=int, default=4, help="chat")
    ap.add_argument("--scale", type=float, default=0.25, help="chat: length scale")
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--attention-base", default="HEAD", help="pf-attention-base: the revision of its kernel")
    args = ap.parse_args(argv)
    if "pf-attention-base" in args.engines.split(","):
        BASE_ATTENTION["fn"] = base_attention(args.attention_base)
    if args.workload != "fixed":
        return workload_main(args)
    engines = args.engines.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    from benchmarks.roofline import measure_ceilings
    from prefixflow.engine import describe_model

    load_before = os.getloadavg()
    loaded: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for e in engines:
        if e.startswith("pf-"):
            loaded[e] = load_pf(e, max(batches) * (args.prompt_len + args.max_tokens))
            run_pf(loaded[e], [[11] * 8] * 2, 2)  # warm-up
            paths[e] = loaded[e].model_identity.get("weight_path")
        elif e in ("hf", "hf-bf16"):
            loaded[e] = load_hf(torch.bfloat16 if e == "hf-bf16" else torch.float32)
        elif e == "llama.cpp":
            loaded[e] = llama_cpp_binary()
    runs: list[dict[str, Any]] = []
    ceilings: dict[int, dict[str, Any]] = {}
    overhead: dict[int, float] = {}
    vocab = 49152
    for t in threads:
        torch.set_num_threads(t)
        # the CPU's own ceiling is its fastest matmul dtype: bf16 doubles it on a native-bf16 CPU
        by_dtype = [measure_ceilings("cpu", d) for d in (torch.float32, torch.bfloat16)]
        best = max(by_dtype, key=lambda c: c.flops_per_s)
        ceilings[t] = {
            "flops_per_s": best.flops_per_s,
            "bytes_per_s": best.bytes_per_s,
            "dtype": best.dtype,
            "flops_per_s_by_dtype": {c.dtype: c.flops_per_s for c in by_dtype},
        }
        if "llama.cpp" in loaded:
            overhead[t] = run_llama_cpp(loaded["llama.cpp"], t, 1, 1, 1)["cpu_s"]
        for b in batches:
            for r in range(args.rounds):
                batch = prompts(b, args.prompt_len, vocab, seed=1000 * r + b)
                for e in engines:
                    if e.startswith("pf-"):
                        with chunking(e):
                            m = run_pf(loaded[e], batch, args.max_tokens)
                    elif e in ("hf", "hf-bf16"):
                        m = run_hf(loaded[e], batch, args.max_tokens)
                    else:
                        m = run_llama_cpp(loaded[e], t, b, args.prompt_len, args.max_tokens)
                        m["cpu_s"] = max(m["cpu_s"] - overhead[t], 1e-9)
                    m.update(engine=e, threads=t, batch=b, round=r, load_average=os.getloadavg()[0])
                    runs.append(m)
                    tok = b * args.prompt_len + m["output_tokens"]
                    print(
                        f"t{t} b{b:3d} r{r} {e:15s} wall {m['wall_s']:7.2f}s cpu {m['cpu_s']:7.2f}s "
                        f"{tok / m['wall_s']:8.1f} tok/s {tok / m['cpu_s']:8.1f} tok/cpu-s",
                        flush=True,
                    )
    rows = summarize(runs, engines, threads, batches, args.prompt_len, ceilings)
    print_table(
        rows,
        [
            "engine",
            "threads",
            "batch",
            "tok_s_min",
            "tok_s_median",
            "tok_per_cpu_s_max",
            "tok_per_cpu_s_median",
            "cpu_s_median",
            "ceiling_frac",
        ],
    )
    result = {
        "benchmark": "cpu_path",
        "model": MODEL,
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "rows": rows,
        "runs": runs,
        "ceilings": ceilings,
        "weight_paths": paths,
        "describe_default": describe_model(MODEL).get("weight_path"),
        "llama_cpp_overhead_cpu_s": overhead,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "environment": environment(),
    }
    if args.json:
        write_json(args.json, result)
    return result


def summarize(
    runs: list[dict[str, Any]],
    engines: list[str],
    threads: list[int],
    batches: list[int],
    prompt_len: int,
    ceilings: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    rows = []
    for t in threads:
        for b in batches:
            for e in engines:
                mine = [m for m in runs if (m["engine"], m["threads"], m["batch"]) == (e, t, b)]
                if not mine:
                    continue
                tok = b * prompt_len + mine[0]["output_tokens"]
                walls, cpus = [m["wall_s"] for m in mine], [m["cpu_s"] for m in mine]
                flops = matmul_flops(prompt_len, mine[0]["output_tokens"] // b, b)
                rows.append(
                    {
                        "engine": e,
                        "threads": t,
                        "batch": b,
                        "tokens": tok,
                        "tok_s_min": round(tok / max(walls), 1),
                        "tok_s_median": round(tok / statistics.median(walls), 1),
                        "tok_per_cpu_s_max": round(tok / min(cpus), 1),
                        "tok_per_cpu_s_median": round(tok / statistics.median(cpus), 1),
                        "cpu_s_median": round(statistics.median(cpus), 2),
                        "ceiling_frac": round(flops / min(walls) / ceilings[t]["flops_per_s"], 3),
                        "ceiling_frac_cpu": round(flops / (min(cpus) / t) / ceilings[t]["flops_per_s"], 3),
                    }
                )
    return rows


def run_pf_requests(llm: Any, prompts_: list[list[int]], outs: list[int]) -> dict[str, float]:
    from prefixflow.engine import SamplingParams

    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in outs]
    c, w = time.process_time(), time.perf_counter()
    done = llm.generate(prompts_, params)
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    return {"wall_s": wall, "cpu_s": cpu, "output_tokens": sum(len(o.token_ids) for o in done)}


def run_hf_requests(model: Any, prompts_: list[list[int]], outs: list[int], batch: int) -> dict[str, float]:
    """Static padded batches (left padding), sorted by prompt length; a batch decodes to its longest output."""
    from transformers import GenerationConfig

    order = sorted(range(len(prompts_)), key=lambda i: -len(prompts_[i]))
    c, w = time.process_time(), time.perf_counter()
    for start in range(0, len(order), batch):
        rows = [prompts_[i] for i in order[start : start + batch]]
        width, steps = max(map(len, rows)), max(outs[i] for i in order[start : start + batch])
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, p in enumerate(rows):
            ids[j, width - len(p) :], mask[j, width - len(p) :] = torch.tensor(p), 1
        gen = GenerationConfig(
            do_sample=False, max_new_tokens=steps, min_new_tokens=steps, eos_token_id=None, pad_token_id=0
        )
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    return {"wall_s": wall, "cpu_s": cpu, "output_tokens": sum(outs)}


def workload_main(args: argparse.Namespace) -> dict[str, Any]:
    """``--workload varied|chat``: every engine on the same requests, rounds interleaved, 1 thread count."""
    from benchmarks import prefix_workloads
    from benchmarks.throughput import varied

    vocab = 49152
    threads = int(args.threads.split(",")[0])
    torch.set_num_threads(threads)
    engines = args.engines.split(",")

    def workload(seed: int) -> Any:  # a fresh seed per round: no prefix-cache hits across rounds
        if args.workload == "varied":
            return varied(args.num_prompts, args.min_len, args.max_len, vocab, seed=seed)
        return prefix_workloads.chat(vocab, args.conversations, args.turns, scale=args.scale, seed=seed)

    rounds = [workload(r) for r in range(args.rounds)]
    kv = max(sum(len(p) + n for p, n in zip(w.prompts, w.max_tokens)) for w in rounds)
    loaded: dict[str, Any] = {}
    for e in engines:
        if e.startswith("pf-"):
            loaded[e] = load_pf(e, kv, prefix_caching=True)
            run_pf(loaded[e], [[11] * 8] * 2, 2)
        else:
            loaded[e] = load_hf(torch.bfloat16 if e == "hf-bf16" else torch.float32)
    load_before, runs = os.getloadavg(), []
    for r, wl in enumerate(rounds):
        prompts_, outs = [list(p) for p in wl.prompts], [int(n) for n in wl.max_tokens]
        tokens = sum(map(len, prompts_)) + sum(outs)
        for e in engines:
            if e.startswith("pf-"):
                with chunking(e):
                    m = run_pf_requests(loaded[e], prompts_, outs)
            else:
                m = run_hf_requests(loaded[e], prompts_, outs, args.hf_batch)
            m.update(engine=e, round=r, tokens=tokens, load_average=os.getloadavg()[0])
            runs.append(m)
            print(
                f"{args.workload} r{r} {e:12s} wall {m['wall_s']:7.2f}s cpu {m['cpu_s']:7.2f}s "
                f"{tokens / m['cpu_s']:8.1f} tok/cpu-s",
                flush=True,
            )
    rows = []
    for e in engines:
        rates = [m["tokens"] / m["cpu_s"] for m in runs if m["engine"] == e]
        rows.append(
            {
                "engine": e,
                "tokens": runs[0]["tokens"],
                "tok_per_cpu_s_max": round(max(rates), 1),
                "tok_per_cpu_s_median": round(statistics.median(rates), 1),
                "cpu_s_median": round(statistics.median(m["cpu_s"] for m in runs if m["engine"] == e), 2),
            }
        )
    print_table(rows, ["engine", "tokens", "tok_per_cpu_s_max", "tok_per_cpu_s_median", "cpu_s_median"])
    result = {
        "benchmark": "cpu_path",
        "workload": args.workload,
        "workload_params": [w.params for w in rounds],
        "requests": len(rounds[0].prompts),
        "threads": threads,
        "rows": rows,
        "runs": runs,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "environment": environment(),
    }
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

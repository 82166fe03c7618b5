"""Roofline lower bound for an offline generation job, from a model shape, a workload and ceilings
measured on this machine in the same run.

bound = max(total FLOPs / peak FLOP/s, total bytes / copy bandwidth)   (perfect overlap)

FLOPs: every computed token pays 2 x (decoder matmul parameters) plus attention over its context
(4 x q_heads x head_dim x keys, per layer); only tokens that produce a sampled token pay the LM
head. The input-embedding table is a gather, not a matmul, so it is not counted: counting it (the
common "2 x all parameters" rule, 16.06 GFLOP/token for Llama-3.1-8B) would overstate a bound that
must never exceed what is achievable.
Bytes: all matmul weights once per step (a step cannot be shorter than one pass over the weights),
plus per decode token its whole context of K/V, plus one K/V write per computed token.
Steps: at least the longest output (each step yields one token per request), and at least
total computed tokens / per-step token budget when a budget is given.

Run: PYTHONPATH=. python benchmarks/roofline.py --model llama-3.1-8b --workload varied
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
MODELS_DIR = REPO / "configs" / "models"
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a Llama-family decoder that the cost model needs (HF config.json keys)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False

    @classmethod
    def from_config(cls, cfg: dict) -> ModelShape:
        heads = int(cfg["num_attention_heads"])
        return cls(
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_q_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            vocab_size=int(cfg["vocab_size"]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )

    @property
    def layer_matmul_params(self) -> int:
        """q, k, v, o projections and the gate/up/down MLP of one decoder layer."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_q_heads * d * 2 + h * self.num_kv_heads * d * 2
        return attn + 3 * h * self.intermediate_size

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def matmul_params(self) -> int:
        """Weights a forward pass multiplies by (read once per step)."""
        return self.num_layers * self.layer_matmul_params + self.lm_head_params

    @property
    def total_params(self) -> int:
        """Everything in the checkpoint: matmuls, input embedding (unless tied), RMSNorm weights."""
        embed = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return self.matmul_params + embed + norms

    def kv_bytes_per_token(self, elem_bytes: int = 2) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem_bytes

    def attention_flops(self, keys: int) -> int:
        """QK^T and PV for one query token over `keys` keys, all layers."""
        return 4 * self.num_layers * self.num_q_heads * self.head_dim * keys


def load_shape(model: str) -> ModelShape:
    """A preset name under configs/models/ (e.g. "llama-3.1-8b"), or a path to a config.json / HF dir."""
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        path = MODELS_DIR / f"{model}.json"
    return ModelShape.from_config(json.loads(path.read_text()))


Workload = Sequence[tuple[int, int]]  # (prompt_len, output_len) per request


def varied_workload(n: int = 256, lo: int = 100, hi: int = 1024, seed: int = 0) -> list[tuple[int, int]]:
    """The `varied` benchmark: prompt and output lengths uniform in [lo, hi]."""
    rng = random.Random(seed)
    return [(rng.randint(lo, hi), rng.randint(lo, hi)) for _ in range(n)]


def parse_workload(spec: str) -> list[tuple[int, int]]:
    """ "varied", "varied:N", "fixed:N" (1024 in / 1024 out), "fixed:N:P:O" or a JSON file of pairs."""
    kind, *nums = spec.split(":")
    if kind == "varied":
        return varied_workload(int(nums[0]) if nums else 256)
    if kind == "fixed":
        n, p, o = (
            (int(nums[0]), *(int(x) for x in nums[1:3])) if len(nums) == 3 else (int(nums[0]), 1024, 1024)
        )
        return [(p, o)] * n
    return [(int(p), int(o)) for p, o in json.loads(Path(spec).read_text())]


@dataclass(frozen=True)
class Ceilings:
    """Measured machine ceilings: copy bandwidth (bytes read + written per second) and matmul rate."""

    bytes_per_s: float
    flops_per_s: float
    device: str
    dtype: str


@dataclass(frozen=True)
class JobCost:
    flops: float
    bytes: float
    steps: int
    computed_tokens: int
    output_tokens: int
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float


def _sum_range(a: int, b: int) -> int:
    """a + (a+1) + ... + b, 0 when b < a."""
    return (a + b) * (b - a + 1) // 2 if b >= a else 0


def job_cost(
    shape: ModelShape,
    workload: Workload,
    weight_bytes_per_param: float = 2.0,
    kv_elem_bytes: int = 2,
    max_tokens_per_step: int | None = None,
) -> JobCost:
    """Total FLOPs and bytes of a job; see the module docstring for what is counted."""
    kvb = shape.kv_bytes_per_token(kv_elem_bytes)
    flops = kv_read = 0
    computed = outputs = longest = 0
    for prompt_len, output_len in workload:
        if prompt_len < 1 or output_len < 1:
            raise ValueError(f"need prompt_len, output_len >= 1, got {(prompt_len, output_len)}")
        last = prompt_len + output_len - 2  # position of the last fed token (the final sample is never fed)
        tokens = last + 1
        # token at position p attends to p + 1 keys
        flops += 2 * shape.num_layers * shape.layer_matmul_params * tokens
        flops += 2 * shape.lm_head_params * output_len
        flops += shape.attention_flops(_sum_range(1, last + 1))
        kv_read += kvb * _sum_range(prompt_len + 1, last + 1)  # decode tokens re-read their context
        computed += tokens
        outputs += output_len
        longest = max(longest, output_len)
    steps = longest
    if max_tokens_per_step:
        steps = max(steps, math.ceil(computed / max_tokens_per_step))
    weight_bytes = shape.matmul_params * weight_bytes_per_param * steps
    kv_write = kvb * computed
    return JobCost(
        flops=float(flops),
        bytes=float(weight_bytes + kv_read + kv_write),
        steps=steps,
        computed_tokens=computed,
        output_tokens=outputs,
        weight_bytes=float(weight_bytes),
        kv_read_bytes=float(kv_read),
        kv_write_bytes=float(kv_write),
    )


def lower_bound_seconds(
    shape: ModelShape,
    workload: Workload,
    ceilings: Ceilings,
    weight_bytes_per_param: float = 2.0,
    kv_elem_bytes: int = 2,
    max_tokens_per_step: int | None = None,
) -> float:
    """The job's roofline lower bound in seconds: max(FLOPs / peak, bytes / bandwidth)."""
    cost = job_cost(shape, workload, weight_bytes_per_param, kv_elem_bytes, max_tokens_per_step)
    return max(cost.flops / ceilings.flops_per_s, cost.bytes / ceilings.bytes_per_s)


def _timed(fn, device: torch.device, repeats: int) -> float:
    """Best wall time of `fn` over `repeats` runs after one warm-up, synchronising CUDA."""
    fn()
    best = math.inf
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def _copy_seconds(nbytes: int, device: torch.device) -> float:
    """Best time to copy nbytes device-to-device (buffers freed on return)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return _timed(lambda: dst.copy_(src), device, repeats=10)


def measure_ceilings(device: str | torch.device = "auto", dtype: torch.dtype | None = None) -> Ceilings:
    """Copy bandwidth of a large device-to-device copy and the rate of a large square matmul.

    CUDA: 2 GiB copy, bf16 8192^3 matmul. CPU: float32, sized to finish in about a second.
    """
    if str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    dtype = dtype or (torch.bfloat16 if on_gpu else torch.float32)

    copy_bytes = (2 << 30) if on_gpu else (128 << 20)
    copy_s = _copy_seconds(copy_bytes, device)

    n = 8192 if on_gpu else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    mm_s = _timed(lambda: a @ b, device, repeats=10 if on_gpu else 3)
    return Ceilings(
        bytes_per_s=2 * copy_bytes / copy_s,
        flops_per_s=2 * n**3 / mm_s,
        device=torch.cuda.get_device_name(device) if on_gpu else "cpu",
        dtype=str(dtype).removeprefix("torch."),
    )


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", default="llama-3.1-8b", help="preset name under configs/models or a config path"
    )
    ap.add_argument(
        "--workload", default="varied", help='"varied", "varied:N", "fixed:N", "fixed:N:P:O" or a JSON file'
    )
    ap.add_argument("--device", default="auto")
    ap.add_argument(
        "--dtype", default=None, help="weights/KV dtype (default bfloat16 on CUDA, float32 on CPU)"
    )
    ap.add_argument("--max-tokens-per-step", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)

    shape = load_shape(args.model)
    workload = parse_workload(args.workload)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    ceilings = measure_ceilings(args.device, dtype)
    elem = DTYPE_BYTES[ceilings.dtype]
    cost = job_cost(shape, workload, elem, elem, args.max_tokens_per_step)
    bound = lower_bound_seconds(shape, workload, ceilings, elem, elem, args.max_tokens_per_step)
    result = {
        "model": args.model,
        "workload": args.workload,
        "requests": len(workload),
        "ceilings": asdict(ceilings),
        "cost": asdict(cost),
        "compute_s": cost.flops / ceilings.flops_per_s,
        "memory_s": cost.bytes / ceilings.bytes_per_s,
        "lower_bound_s": bound,
        "bound_output_tokens_per_s": cost.output_tokens / bound,
    }
    print(f"device {ceilings.device} ({ceilings.dtype}): copy {ceilings.bytes_per_s / 1e9:.1f} GB/s, "
          f"matmul {ceilings.flops_per_s / 1e12:.2f} TFLOP/s")  # fmt: skip
    print(f"model {args.model}: {shape.matmul_params / 1e6:,.1f} M matmul params, "
          f"KV {shape.kv_bytes_per_token(elem) / 1024:g} KiB/token")  # fmt: skip
    print(f"workload {args.workload}: {len(workload)} requests, {cost.computed_tokens} computed tokens, "
          f"{cost.output_tokens} output tokens, >= {cost.steps} steps")  # fmt: skip
    print(f"FLOPs {cost.flops / 1e12:.2f} T -> {result['compute_s']:.3f} s; bytes {cost.bytes / 1e9:.2f} GB "
          f"-> {result['memory_s']:.3f} s; lower bound {bound:.3f} s "
          f"({result['bound_output_tokens_per_s']:.0f} output tok/s)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])

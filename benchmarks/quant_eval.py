"""Label agreement of quantized SmolLM2 with the full-precision engine on the review set (issue 12).

For each variant the 60 reviews of ``benchmarks/data/reviews.jsonl`` are labelled by scoring both
labels (``benchmarks.eval_smollm2.label_reviews``); agreement is the share of reviews whose predicted
label equals the full-precision engine's (``quantization="none"``: the GGUF's Q4_1 blocks dequantized
to float32). Goal: int8 agrees on >= 97 % of the labels. ``sparse24`` is ``sparsity="2:4"`` on the
dequantized GGUF (issue 29: what magnitude pruning without retraining costs).

    python -m benchmarks.quant_eval --variants none,gguf,int8,int4,fp8 --json benchmarks/results/cpu_quant_eval.json
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch

from benchmarks.common import environment, write_json
from benchmarks.eval_smollm2 import label_reviews, read_jsonl

MODEL = "smollm2-135m-instruct"


def evaluate(variant: str, reviews: list[dict], dtype: str) -> dict[str, Any]:
    from prefixflow.engine import LLM

    # sparse24: the GGUF dequantized, then pruned 2:4 by magnitude on the fly (issue 29); "gguf": kept packed
    quantization = {"none": "none", "sparse24": "none"}.get(variant, variant)
    sparsity = "2:4" if variant == "sparse24" else None
    start = time.perf_counter()
    llm = LLM(model=MODEL, dtype=dtype, quantization=quantization, sparsity=sparsity)
    result = label_reviews(llm, reviews)
    result["seconds"] = time.perf_counter() - start
    result["weight_bytes"] = llm.stats().weight_bytes
    return result


def set_int4_group(group: int) -> None:
    """Diagnostic only: the engine's int4 is group 128 by definition (issue 12); this measures how much
    of int4's loss on the already 4-bit SmolLM2 comes from the group size."""
    from prefixflow.engine.quantization import online

    online.INT4_GROUP = group
    online.quantize_int4.__defaults__ = (group,)


def agreement(a: dict[str, Any], b: dict[str, Any]) -> float:
    same = sum(x["predicted"] == y["predicted"] for x, y in zip(a["items"], b["items"]))
    return same / len(a["items"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="none,gguf,int8,int4,fp8")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument(
        "--int4-group",
        type=int,
        default=None,
        help="diagnostic: on-the-fly int4 with this group size instead of 128 (patches the method)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.int4_group:
        set_int4_group(args.int4_group)
    reviews = read_jsonl("reviews.jsonl")
    load_before = os.getloadavg()
    results = {v: evaluate(v, reviews, args.dtype) for v in args.variants.split(",")}
    base = results.get("none")
    rows = []
    for variant, r in results.items():
        row = {
            "variant": variant,
            "accuracy": r["accuracy"],
            "weight_bytes": r["weight_bytes"],
            "seconds": round(r["seconds"], 1),
        }
        if base is not None:
            row["agreement_with_none"] = agreement(r, base)
        rows.append(row)
        print(row, flush=True)
    out = {
        "benchmark": "quant_eval",
        "model": MODEL,
        "dtype": args.dtype,
        "int4_group": args.int4_group or 128,
        "rows": rows,
        "results": results,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "environment": environment(),
    }
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()

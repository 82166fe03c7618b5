"""Engine vs transformers ``generate`` (padded static batches) on the same model and workload (issue 2).

Greedy, EOS ignored on both sides, the same ``max_new_tokens`` for every request; transformers gets
left-padded batches of ``--batch-size`` prompts in input order.

    python -m benchmarks.engine_vs_hf                       # CPU: tiny preset, 64 prompts
    python -m benchmarks.engine_vs_hf --preset llama-3.1-8b --num-prompts 256 --batch-size 64
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from functools import partial

from benchmarks.common import (
    add_common_args,
    build_model,
    environment,
    print_table,
    random_tokens,
    setup_threads,
    write_json,
)
from benchmarks.peers import best_of, greedy_agreement, make_llm, release, run_hf_generate, run_prefixflow


def workload(n: int, min_len: int, max_len: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """``n`` random token-id prompts with lengths uniform in [min_len, max_len]."""
    rng = random.Random(seed)
    return [random_tokens(rng, rng.randint(min_len, max_len), vocab_size) for _ in range(n)]


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--min-prompt-len", type=int, default=16)
    ap.add_argument("--max-prompt-len", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16, help="transformers static batch size")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument(
        "--repeats", type=int, default=1, help="time each engine this many times, keep the fastest"
    )
    ap.add_argument(
        "--num-kv-blocks", type=int, default=None, help="engine KV pool (default: its own sizing)"
    )
    args = ap.parse_args(argv)
    setup_threads(args.threads, args.device)

    bm = build_model(args.preset, args.device, args.dtype, args.seed)
    prompts = workload(args.num_prompts, args.min_prompt_len, args.max_prompt_len, bm.vocab_size, args.seed)
    outs = [args.max_new_tokens] * len(prompts)
    warm = prompts[:2], [2, 2]

    llm = make_llm(
        bm, max_num_seqs=args.max_num_seqs, enable_prefix_caching=False, num_kv_blocks=args.num_kv_blocks
    )
    run_prefixflow(llm, *warm)
    engine = best_of(args.repeats, partial(run_prefixflow, llm, prompts, outs))
    del llm
    release()
    run_hf_generate(bm, *warm, batch_size=2)
    hf = best_of(args.repeats, lambda: run_hf_generate(bm, prompts, outs, batch_size=args.batch_size))

    rows = [engine.summary(), hf.summary()]
    ratio = rows[0]["output_tok_s"] / rows[1]["output_tok_s"]
    result = {
        "benchmark": "engine_vs_hf",
        "preset": args.preset,
        "device": bm.device.type,
        "dtype": str(bm.dtype).removeprefix("torch."),
        "workload": {
            "num_prompts": len(prompts),
            "prompt_len": [args.min_prompt_len, args.max_prompt_len],
            "max_new_tokens": args.max_new_tokens,
            "hf_batch_size": args.batch_size,
            "seed": args.seed,
        },
        "engines": rows,
        "ratio_output_tok_s": ratio,
        "greedy_agreement": greedy_agreement(engine.outputs, hf.outputs),
        "environment": environment(),
    }
    print_table(
        rows,
        ["engine", "requests", "output_tokens", "elapsed_s", "output_tok_s", "total_tok_s"],
        title=f"engine vs transformers generate ({args.preset}, {bm.device.type})",
    )
    print(
        f"ratio prefixflow / hf_generate (output tok/s): {ratio:.2f}x; "
        f"identical greedy outputs: {result['greedy_agreement']:.0%}"
    )
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])

"""Constrained vs unconstrained decoding on the same rows, side by side (SmolLM2 on CPU by default).

Workload: ``benchmarks/structured_workload.py`` (three JSON schemas over the review and news texts),
chat-templated, greedy. The constrained run generates each row under its schema until the grammar ends
it; the unconstrained peer generates, per row, exactly as many tokens (``max_tokens`` = that row's
constrained length, EOS ignored), so both runs have the same batch shapes and token counts and the
difference is the cost of constraining: the bitmask fill (on a worker thread, overlapped with the
model), the wait for it, and applying it in the sampler. Rounds alternate C U C U ...; min and
median per mode, and the C/U ratio of each adjacent pair.

    python -m benchmarks.structured_bench --rows 48 --repeats 3 --json benchmarks/results/cpu_structured.json
    python -m benchmarks.structured_bench --preset llama-3.2-1b --rows 96   # GPU: random weights, GPU-size model
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from benchmarks.common import environment, print_table, setup_threads, write_json
from benchmarks.structured_workload import MAX_TOKENS, SCHEMAS, extraction_prompts, extraction_rows


def _constrained(rows: list[tuple[str, str]]) -> list:
    from prefixflow.engine import SamplingParams, StructuredOutputs

    return [
        SamplingParams(max_tokens=MAX_TOKENS, structured=StructuredOutputs(json_schema=SCHEMAS[n]))
        for n, _ in rows
    ]


def _run(llm, prompts: list[str], params: list) -> dict:
    before = llm.stats().as_dict()
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    after = llm.stats().as_dict()
    steps = after["steps"] - before["steps"]
    masked = after["masked_steps"] - before["masked_steps"]
    tokens = sum(o.num_output_tokens for o in outs)
    return {
        "seconds": seconds,
        "output_tokens": tokens,
        "tok_s": tokens / seconds,
        "steps": steps,
        "ms_per_step": 1000 * seconds / steps,
        "masked_steps": masked,
        "mask_fill_ms_per_step": 1000 * (after["mask_fill_s"] - before["mask_fill_s"]) / masked
        if masked
        else 0.0,
        "mask_wait_ms_per_step": 1000 * (after["mask_wait_s"] - before["mask_wait_s"]) / masked
        if masked
        else 0.0,
        "outputs": outs,
    }


def apply_cost(vocab: int, batch: int, repeats: int = 20) -> float:
    """ms to apply a realistic bitmask (a few allowed tokens per row) to [batch, vocab] float32 logits."""
    from prefixflow.engine.structured.bitmask import apply_bitmask_, bitmask_words

    mask = torch.zeros((batch, bitmask_words(vocab)), dtype=torch.int32)
    mask[:, :4] = -1
    logits = torch.randn(batch, vocab)
    apply_bitmask_(logits, mask)
    start = time.perf_counter()
    for _ in range(repeats):
        apply_bitmask_(logits, mask)
    return 1000 * (time.perf_counter() - start) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument(
        "--preset", default=None, help="instead of --model: a random-weight preset built on the device"
    )
    ap.add_argument("--rows", type=int, default=48, help="rows in all, split over the three schemas")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    setup_threads(args.threads, args.device)
    from prefixflow.engine import LLM, SamplingParams

    if args.preset:  # random weights straight on the device (no checkpoint written): for GPU-size models
        from benchmarks.common import build_model
        from benchmarks.peers import make_llm

        llm = make_llm(build_model(args.preset, args.device))
    else:
        llm = LLM(args.model, device=args.device)
    per = max(1, args.rows // 3)
    all_rows = extraction_rows(per_review_schema=per)
    rows = all_rows[: 2 * per] + [r for r in all_rows if r[0] == "news"][: args.rows - 2 * per]
    prompts = extraction_prompts(llm, rows)
    constrained = _constrained(rows)
    _run(llm, prompts[:3] + prompts[-1:], constrained[:3] + constrained[-1:])  # warm-up: compile the grammars
    first = _run(llm, prompts, constrained)
    lengths = [o.num_output_tokens for o in first["outputs"]]
    free = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    rounds: dict[str, list[dict]] = {"constrained": [], "unconstrained": []}
    load_avgs = []
    for _ in range(args.repeats):
        for mode, params in (("constrained", constrained), ("unconstrained", free)):
            load_avgs.append(f"{os.getloadavg()[0]:.2f}")
            result = _run(llm, prompts, params)
            if mode == "unconstrained":
                assert [o.num_output_tokens for o in result["outputs"]] == lengths
            else:
                assert [o.token_ids for o in result["outputs"]] == [o.token_ids for o in first["outputs"]]
            result.pop("outputs")
            rounds[mode].append(result)
    valid = _count_valid(rows, first["outputs"])
    ratios = [c["tok_s"] / u["tok_s"] for c, u in zip(rounds["constrained"], rounds["unconstrained"])]
    table = []
    for mode, rs in rounds.items():
        tok = [r["tok_s"] for r in rs]
        table.append(
            {
                "mode": mode,
                "rows": len(rows),
                "out_tokens": rs[0]["output_tokens"],
                "steps": rs[0]["steps"],
                "tok_s_min": min(tok),
                "tok_s_median": statistics.median(tok),
                "ms_per_step_median": statistics.median(r["ms_per_step"] for r in rs),
                "fill_ms_per_step": statistics.median(r["mask_fill_ms_per_step"] for r in rs),
                "wait_ms_per_step": statistics.median(r["mask_wait_ms_per_step"] for r in rs),
            }
        )
    print_table(table, list(table[0]), title="constrained vs unconstrained (same rows, same token counts)")
    batch = min(len(rows), llm.config.max_num_seqs)
    summary = {
        "ratio_pairs": ratios,
        "ratio_min": min(ratios),
        "ratio_median": statistics.median(ratios),
        "valid_outputs": valid,
        "apply_ms_at_batch": {str(b): apply_cost(llm.engine.model_cfg.vocab_size, b) for b in (1, 16, batch)},
        "load_averages": load_avgs,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "load_averages"}, indent=1))
    print("1-minute load average before each run:", " ".join(load_avgs))
    write_json(
        args.json,
        {
            "environment": environment(),
            "args": vars(args),
            "table": table,
            "summary": summary,
            "rounds": rounds,
        },
    )


def _count_valid(rows: list[tuple[str, str]], outs: list) -> dict:
    try:
        import jsonschema
    except ImportError:  # the GPU machine may lack it: the figure is the throughput, not validity
        return {"valid": None, "rows": len(rows)}

    valid = 0
    for (name, _), out in zip(rows, outs):
        try:
            jsonschema.validate(json.loads(out.text), SCHEMAS[name])
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    return {"valid": valid, "rows": len(rows)}


if __name__ == "__main__":
    main()

"""Render benchmark JSON results as Markdown tables (for benchmarks/RESULTS.md).

python -m benchmarks.report benchmarks/results/cpu_*.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import fmt

ENGINE_COLS = ["engine", "requests", "output_tokens", "elapsed_s", "output_tok_s", "total_tok_s"]
PREFIX_COLS = [
    "config",
    "kv_blocks",
    "computed_prompt_tokens",
    "computed/distinct",
    "computed/block_min",
    "prefix_hit_rate",
    "preemptions",
    "elapsed_s",
    "output_tok_s",
    "total_tok_s",
]
THROUGHPUT_COLS = [
    "subset",
    "engine",
    "requests",
    "output_tokens",
    "elapsed_s",
    "output_tok_s",
    "total_tok_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "itl_p50_s",
    "itl_p90_s",
    "itl_p99_s",
    "roofline_frac",
    "host_ms_per_step",
]


def markdown_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def render(result: dict) -> str:
    kind = result.get("benchmark")
    env = result.get("environment", {})
    head = (
        f"`{kind}` · preset {result.get('preset')} · {result.get('device')} {result.get('dtype')} · "
        f"torch {env.get('torch')} · transformers {env.get('transformers')} · "
        f"threads {env.get('torch_threads')} · load {fmt(env.get('load_average_1m'))} · "
        f"commit {env.get('git_commit')}"
    )
    parts = [head, ""]
    if kind == "engine_vs_hf":
        parts += [
            f"workload: {json.dumps(result['workload'])}",
            "",
            markdown_table(result["engines"], ENGINE_COLS),
        ]
        parts += [
            "",
            f"ratio {result['ratio_output_tok_s']:.2f}x; identical greedy outputs "
            f"{result['greedy_agreement']:.0%}",
        ]
    elif kind == "prefix_bench":
        for w in result["workloads"]:
            parts += [
                f"workload: {json.dumps(w['workload'])}",
                "",
                markdown_table(w["runs"], PREFIX_COLS),
                "",
            ]
    elif kind == "throughput":
        parts += [
            f"workload: {json.dumps(result['workload'])}",
            "",
            markdown_table(result["rows"], THROUGHPUT_COLS),
        ]
        parts += [""] + [
            f"prefixflow / {k}: {v:.2f}x output tok/s" for k, v in result["ratio_to_peer"].items()
        ]
        parts += [f"{k}: skipped ({v})" for k, v in result.get("skipped", {}).items()]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> None:
    for path in argv if argv is not None else sys.argv[1:]:
        print(f"### {Path(path).name}\n")
        print(render(json.loads(Path(path).read_text())))
        print()


if __name__ == "__main__":
    main()

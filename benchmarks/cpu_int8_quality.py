"""Quality of the CPU int8 path (w8a8, kernels/cpu_int8.py) against float32 on the embedded SmolLM2 (issue 24).

Engines: ``float32`` (``cpu_int8="off"``), ``int8`` (the default on this GGUF: every linear layer and
the tied LM head in int8) and ``int8-head-fp32`` (the layers in int8, the LM head float32; how much
of the difference the head makes). Per engine:
- greedy generations on the demo reviews (pipeline/data/demo_reviews.jsonl), 48 new tokens, chat
  template: tokens equal to float32's at the same position, up to the first divergence, and whole
  outputs equal;
- next-token top-1 over every prompt position of the shipped texts (demo reviews, benchmarks/data
  reviews, tickets, news): the top-1 token equal to float32's, and |logprob| differences of the prompt
  tokens (mean and max), from ``prompt_logprobs=1``;
- the label task's accuracy (benchmarks/eval_labels.py: reviews/plain, tickets/chat-described,
  news/plain) and the demo's agreement (benchmarks/eval_labels_demo.py).

    python -m benchmarks.cpu_int8_quality --json benchmarks/results/cpu_int8_quality.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import environment, print_table, setup_threads, write_json

MODEL = "smollm2-135m-instruct"
ROOT = Path(__file__).parents[1]


def texts() -> tuple[list[str], list[str]]:
    """(demo review texts, every shipped text)."""
    demo = [
        json.loads(x)["text"]
        for x in (ROOT / "pipeline/data/demo_reviews.jsonl").read_text().splitlines()
        if x
    ]
    more = []
    for name in ("reviews", "tickets", "news"):
        lines = (ROOT / "benchmarks/data" / f"{name}.jsonl").read_text().splitlines()
        more += [json.loads(x)["text"] for x in lines if x.strip()]
    return demo, demo + more


def make(engine: str) -> Any:
    from prefixflow.engine import LLM

    llm = LLM(MODEL, cpu_int8="off" if engine == "float32" else "auto", enable_prefix_caching=False)
    if engine == "int8-head-fp32":
        llm.engine.runner.shard.model.int8_head = None
    return llm


def greedy(llm: Any, demo: list[str]) -> list[list[int]]:
    from prefixflow.engine import SamplingParams

    chats = [[{"role": "user", "content": f"Summarize this review in one sentence: {t}"}] for t in demo]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.chat(chats, params)]


def next_tokens(llm: Any, every: list[str]) -> list[list[tuple[int, float]]]:
    """Per text, per position after the first: (top-1 token, logprob of the prompt token)."""
    from prefixflow.engine import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
    out = []
    for o in llm.generate(every, params):
        rows = []
        ids = o.prompt_token_ids
        for pos, entry in enumerate(o.prompt_logprobs or []):
            if entry is None:
                continue
            top = min(entry.items(), key=lambda kv: kv[1].rank or 1 << 30)[0]
            rows.append((top, entry[ids[pos]].logprob))
        out.append(rows)
    return out


def labels(llm: Any) -> dict[str, Any]:
    from benchmarks.eval_labels import SETS, evaluate_style, read_jsonl
    from benchmarks.eval_labels_demo import demo_agreement

    out: dict[str, Any] = {}
    for set_name, style_name in (("reviews", "plain"), ("tickets", "chat-described"), ("news", "plain")):
        label_set = next(s for s in SETS if s.name == set_name)
        style = next(s for s in label_set.styles if s.name == style_name)
        res = evaluate_style(llm, label_set, style, read_jsonl(label_set.file), permute=False)
        out[f"{set_name}/{style_name}"] = {
            m: round(r["accuracy"], 3)
            for m, r in res["methods"].items()
            if m in ("raw (before issue 14)", "contextual + case, mean")
        }
    demo = demo_agreement(llm)
    out["demo"] = {s: {m: f"{r['agree']}/{r['of']}" for m, r in ms.items()} for s, ms in demo.items()}
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default="float32,int8,int8-head-fp32")
    ap.add_argument("--no-labels", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    setup_threads(1)
    demo, every = texts()
    found: dict[str, Any] = {}
    for engine in args.engines.split(","):
        llm = make(engine)
        found[engine] = {
            "identity": llm.model_identity.get("linear_kernel"),
            "greedy": greedy(llm, demo),
            "next": next_tokens(llm, every),
            "labels": None if args.no_labels else labels(llm),
        }
        del llm
    base = found["float32"]
    rows = []
    for engine, f in found.items():
        same_pos = total = prefix = whole = 0
        for a, b in zip(f["greedy"], base["greedy"]):
            total += len(b)
            same_pos += sum(x == y for x, y in zip(a, b))
            n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(b))
            prefix += n
            whole += a == b
        pairs = [(x, y) for ta, tb in zip(f["next"], base["next"]) for x, y in zip(ta, tb)]
        top1 = sum(x[0] == y[0] for x, y in pairs) / len(pairs)
        diffs = [abs(x[1] - y[1]) for x, y in pairs]
        rows.append(
            {
                "engine": engine,
                "greedy equal outputs": f"{whole}/{len(base['greedy'])}",
                "greedy tokens before divergence": f"{prefix / total:.3f}",
                "greedy same token at position": f"{same_pos / total:.3f}",
                "next-token top-1 agree": f"{top1:.4f} of {len(pairs)}",
                "|dlogprob| mean": f"{sum(diffs) / len(diffs):.4f}",
                "|dlogprob| max": f"{max(diffs):.3f}",
                "labels": json.dumps(f["labels"]),
            }
        )
    print_table(rows, list(rows[0]), title="int8 (w8a8) vs float32, SmolLM2-135M Q4_1")
    result = {
        "environment": environment(),
        "rows": rows,
        "identity": {e: f["identity"] for e, f in found.items()},
    }
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

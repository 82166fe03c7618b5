"""The demo's labeling job (pipeline/data/demo_label.yaml) on its 24 reviews, per method and prompt.

The reviews ship without labels, so this compares with one reading of them (``DEMO_READING``) on the
20 that are clearly positive, negative or neutral, and reports how many rows each label takes. It is
where contextual calibration was seen to fail: the demo's former chat question (three sentiments).

    python -m benchmarks.eval_labels_demo --json benchmarks/results/cpu_eval_labels_demo.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import environment, print_table, setup_threads, write_json
from benchmarks.eval_labels import METHODS, MODEL, LabelSet, Style, method_probs, score_style

# The demo's 24 reviews (pipeline/data/demo_reviews.jsonl) ship without labels; this is one reading of
# them (pos / neg / neu, "mix" for reviews that weigh both ways, left out of the agreement count).
DEMO_READING = (
    "pos neg pos pos neg pos mix pos neg mix pos neg mix neg pos neu pos neg mix pos neg pos pos neg"
)
DEMO_SET = LabelSet(
    "demo",
    "",
    ("positive", "negative", "neutral"),
    (
        Style(
            "chat (the demo's job before issue 14)",
            "Is the sentiment of this review positive, negative or neutral?\n\nReview: {{{{ text }}}}",
            "on",
            "",
            system_prompt="You label product reviews. Answer with one word.",
        ),
        Style(
            "plain (the demo's job now)",
            "Review: {{{{ text }}}}\nOverall, the reviewer's opinion of the product is",
            "off",
            " ",
        ),
    ),
)


def demo_agreement(llm) -> dict:
    """Label counts and agreement with DEMO_READING on its clear rows, per method, for both demo prompts."""
    path = Path(__file__).parents[1] / "pipeline" / "data" / "demo_reviews.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    reading = DEMO_READING.split()
    clear = [i for i, r in enumerate(reading) if r != "mix"]
    out: dict[str, Any] = {}
    for style in DEMO_SET.styles:
        raw = score_style(llm, DEMO_SET, style, rows)
        out[style.name] = {}
        for name, method, norm, case in METHODS:
            if method == "domain" and "domain" not in raw["refs"]:
                continue
            probs = method_probs(DEMO_SET, style, raw, method, norm, case)
            pred = [DEMO_SET.labels[max(range(3), key=lambda k: p[k])][:3] for p in probs]
            out[style.name][name] = {
                "agree": sum(pred[i] == reading[i] for i in clear),
                "of": len(clear),
                "counts": [pred.count(lb[:3]) for lb in DEMO_SET.labels],
            }
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    setup_threads(args.threads)
    from prefixflow.engine import LLM

    result: dict[str, Any] = {"model": args.model, "dtype": args.dtype, "environment": environment()}
    result["demo"] = demo_agreement(LLM(model=args.model, dtype=args.dtype))
    for style, methods in result["demo"].items():
        rows = [
            {"method": m, "agree": f"{r['agree']}/{r['of']}", "counts (pos, neg, neu)": r["counts"]}
            for m, r in methods.items()
        ]
        print_table(rows, ["method", "agree", "counts (pos, neg, neu)"], title=f"demo reviews / {style}")
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

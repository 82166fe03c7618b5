"""xgrammar vs llguidance on this project's workload: which grammar engine backs structured outputs.

Both engines get the same tokenizer (the embedded SmolLM2's GGUF tokenizer, 49,152 tokens), the same
constraints (three JSON schemas, a regex, a choice) with the same compact separators (", " and ": ",
no free whitespace), and replay the same valid answers token by token, as a decoding loop would:
fill the next-token bitmask, check the answer's token is allowed, accept it; at the end EOS must be
the only way out. Measured per engine, interleaved A B A B over ``--repeats`` rounds:

- tokenizer-info build (once per model load),
- grammar compile (first use of each constraint; what a job pays up front),
- mask fill per step for one request, and for a batch of ``--batch`` requests (each engine's own
  batched fill on ``--threads`` threads), the cost the step loop must hide behind the forward pass,
- accept per token.

    python -m benchmarks.grammar_engines --json benchmarks/results/cpu_grammar_engines.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import environment, write_json

REVIEW = {
    "type": "object",
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "product": {"type": "string"},
        "issues": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["sentiment", "product", "issues"],
    "additionalProperties": False,
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "address"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer", "minimum": 1},
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
        },
        "express": {"type": "boolean"},
        "total": {"type": "number"},
    },
    "required": ["order_id", "items", "express", "total"],
    "additionalProperties": False,
}
CASES: list[tuple[str, str, Any, str]] = [
    (
        "json:review",
        "json",
        REVIEW,
        '{"sentiment": "negative", "product": "wireless headphones", "issues": ["left ear cup stopped working", '
        '"return shipping at own cost"]}',
    ),
    (
        "json:person",
        "json",
        PERSON,
        '{"name": "Ada Lovelace", "age": 36, "address": {"city": "London", "zip": "10115"}}',
    ),
    (
        "json:order",
        "json",
        ORDER,
        '{"order_id": 4471, "items": [{"sku": "KT-100", "qty": 2}, {"sku": "LMP-7", "qty": 1}], '
        '"express": true, "total": 84.5}',
    ),
    ("regex:phone", "regex", r"\(\d{3}\) \d{3}-\d{4}", "(555) 867-5309"),
    ("choice", "choice", ["positive", "negative", "neutral"], "neutral"),
]


def choice_regex(options: list[str]) -> str:
    import re

    return "(" + "|".join(re.escape(o) for o in options) + ")"


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok: Any, vocab: int, eos: list[int]) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab, stop_token_ids=eos)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self.vocab = vocab

    def compile(self, kind: str, spec: Any) -> Any:
        if kind == "json":
            return self.compiler.compile_json_schema(json.dumps(spec), any_whitespace=False)
        return self.compiler.compile_regex(spec if kind == "regex" else choice_regex(spec))

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m: Any, bitmask: torch.Tensor, i: int) -> None:
        m.fill_next_token_bitmask(bitmask, i)

    def fill_batch(self, ms: list, bitmask: torch.Tensor, threads: int) -> None:
        if not hasattr(self, "batch"):
            self.batch = self.xgr.BatchGrammarMatcher(max_threads=threads)
        self.batch.batch_fill_next_token_bitmask(ms, bitmask)

    def accept(self, m: Any, token: int) -> bool:
        return bool(m.accept_token(token))

    def can_end(self, m: Any, eos: int, bitmask: torch.Tensor) -> bool:
        m.fill_next_token_bitmask(bitmask, 0)
        return allowed(bitmask[0], eos)


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok: Any, vocab: int, eos: list[int]) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.lt = llguidance.torch
        self.tok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab, eos_token=eos[0])
        self.vocab = vocab
        self.options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

    def compile(self, kind: str, spec: Any) -> Any:
        M = self.llg.LLMatcher
        if kind == "json":
            grammar = M.grammar_from_json_schema(spec, overrides=self.options)
        else:
            grammar = M.grammar_from_regex(spec if kind == "regex" else choice_regex(spec))
        m = M(self.tok, grammar)  # llguidance compiles lazily: the first matcher pays
        if m.is_error():
            raise ValueError(m.get_error())
        return grammar

    def matcher(self, grammar: str) -> Any:
        return self.llg.LLMatcher(self.tok, grammar)

    def fill(self, m: Any, bitmask: torch.Tensor, i: int) -> None:
        self.lt.fill_next_token_bitmask(m, bitmask, i)

    def fill_batch(self, ms: list, bitmask: torch.Tensor, threads: int) -> None:
        if not hasattr(self, "executor"):
            self.executor = self.llg.LLExecutor(num_threads=threads)
        self.lt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(ms)], bitmask)

    def accept(self, m: Any, token: int) -> bool:
        return bool(m.consume_token(token))

    def can_end(self, m: Any, eos: int, bitmask: torch.Tensor) -> bool:
        self.lt.fill_next_token_bitmask(m, bitmask, 0)
        return allowed(bitmask[0], eos) and m.is_accepting()


def allowed(row: torch.Tensor, token: int) -> bool:
    return bool((int(row[token // 32]) >> (token % 32)) & 1)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def run_engine(eng: Any, targets: dict[str, list[int]], eos: int, batch: int, threads: int) -> dict:
    words = (eng.vocab + 31) // 32
    mask = torch.zeros((max(batch, 1), words), dtype=torch.int32)
    out: dict[str, dict] = {}
    for name, kind, spec, _text in CASES:
        compile_s, compiled = timed(lambda kind=kind, spec=spec: eng.compile(kind, spec))
        m = eng.matcher(compiled)
        fills, accepts, violations = [], [], 0
        for tok in targets[name]:
            s, _ = timed(lambda m=m: eng.fill(m, mask, 0))
            fills.append(s)
            violations += not allowed(mask[0], tok)
            s, ok = timed(lambda m=m, tok=tok: eng.accept(m, tok))
            accepts.append(s)
            violations += not ok
        ends = eng.can_end(m, eos, mask)
        ms = [eng.matcher(compiled) for _ in range(batch)]
        batch_fills = []
        for tok in targets[name]:
            s, _ = timed(lambda ms=ms: eng.fill_batch(ms, mask, threads))
            batch_fills.append(s)
            for bm in ms:
                eng.accept(bm, tok)
        out[name] = {
            "tokens": len(targets[name]),
            "compile_ms": compile_s * 1e3,
            "fill_us_mean": statistics.fmean(fills) * 1e6,
            "fill_us_max": max(fills) * 1e6,
            "accept_us_mean": statistics.fmean(accepts) * 1e6,
            "batch_fill_ms_mean": statistics.fmean(batch_fills) * 1e3,
            "violations": violations,
            "eos_allowed_at_end": ends,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from prefixflow.engine.loading.loader import resolve_model

    src = resolve_model(args.model)
    tok, vocab, eos = src.tokenizer, int(src.hf_config["vocab_size"]), list(src.eos_token_ids)
    targets = {name: tok.encode(text, add_special_tokens=False) for name, _, _, text in CASES}
    rounds: dict[str, list] = {"xgrammar": [], "llguidance": []}
    for _ in range(args.repeats):
        for cls in (
            XGrammar,
            LLGuidance,
        ):  # interleaved A B A B; a fresh engine (no compile cache) each round
            info_s, eng = timed(lambda cls=cls: cls(tok, vocab, eos))
            rounds[cls.name].append(
                {
                    "tokenizer_info_ms": info_s * 1e3,
                    "cases": run_engine(eng, targets, eos[0], args.batch, args.threads),
                }
            )
    summary = {name: summarize(rs) for name, rs in rounds.items()}
    print_summary(summary, args)
    if args.json:
        write_json(
            args.json,
            {"environment": environment(), "args": vars(args), "summary": summary, "rounds": rounds},
        )


def summarize(rounds: list[dict]) -> dict:
    def stat(values: list[float]) -> dict:
        return {"min": min(values), "median": statistics.median(values)}

    out: dict[str, Any] = {"tokenizer_info_ms": stat([r["tokenizer_info_ms"] for r in rounds])}
    for name in rounds[0]["cases"]:
        cases = [r["cases"][name] for r in rounds]
        out[name] = {
            k: stat([c[k] for c in cases])
            for k in ("compile_ms", "fill_us_mean", "accept_us_mean", "batch_fill_ms_mean")
        }
        out[name]["violations"] = max(c["violations"] for c in cases)
        out[name]["eos_allowed_at_end"] = all(c["eos_allowed_at_end"] for c in cases)
        out[name]["tokens"] = cases[0]["tokens"]
    return out


def print_summary(summary: dict, args: argparse.Namespace) -> None:
    print(
        f"min / median of {args.repeats} interleaved rounds; batch fill = {args.batch} requests on {args.threads} threads"
    )
    for eng, s in summary.items():
        print(
            f"\n{eng}: tokenizer info {s['tokenizer_info_ms']['min']:.0f} / {s['tokenizer_info_ms']['median']:.0f} ms"
        )
        print(
            f"  {'case':13} {'tok':>4} {'compile ms':>14} {'fill us':>14} {'accept us':>12} {'batch fill ms':>14} viol eos"
        )
        for name, c in s.items():
            if name == "tokenizer_info_ms":
                continue

            def mm(k: str, fmt: str, c: dict = c) -> str:
                return f"{c[k]['min']:{fmt}}/{c[k]['median']:{fmt}}"

            print(
                f"  {name:13} {c['tokens']:4d} {mm('compile_ms', '.1f'):>14} {mm('fill_us_mean', '.0f'):>14} "
                f"{mm('accept_us_mean', '.0f'):>12} {mm('batch_fill_ms_mean', '.2f'):>14} {c['violations']:4d} {c['eos_allowed_at_end']}"
            )


if __name__ == "__main__":
    main()

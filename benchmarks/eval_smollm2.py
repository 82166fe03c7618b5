"""Quality and CPU throughput of the embedded SmolLM2-135M-Instruct (GGUF) through the engine.

1. Sentiment labeling of 60 written-for-the-project product reviews: each label ("positive",
   "negative") is scored as the continuation of a chat-templated question (``llm.score_choices``);
   the higher log-probability wins. Reports accuracy.
2. One-sentence summaries of 20 news-style paragraphs (greedy).
3. Throughput on 64 chat prompts, engine vs transformers ``generate`` on its own GGUF loading of the
   same file with left-padded static batches; greedy, EOS ignored, the same ``max_tokens`` on both.

    python -m benchmarks.eval_smollm2                     # everything, table on stdout
    python -m benchmarks.eval_smollm2 --json out.json --skip-throughput
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.common import environment, print_table, setup_threads, write_json

MODEL = "smollm2-135m-instruct"
DATA = Path(__file__).parent / "data"
LABELS = ("positive", "negative")
LABEL_QUESTION = (
    "Is the sentiment of this product review positive or negative? Answer with one word.\n\nReview: {text}"
)
SUMMARY_QUESTION = "Summarize this news paragraph in one sentence.\n\n{text}"


def read_jsonl(name: str) -> list[dict]:
    with (DATA / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def chat(llm, question: str) -> str:
    return llm.apply_chat_template([{"role": "user", "content": question}])


def label_reviews(llm, reviews: Sequence[dict]) -> dict:
    """Accuracy of picking the label with the higher total log-probability as the assistant's answer."""
    prompts = [chat(llm, LABEL_QUESTION.format(text=r["text"])) for r in reviews]
    scores = llm.score_choices(prompts, [list(LABELS)] * len(prompts))
    rows, correct = [], 0
    for review, score in zip(reviews, scores):
        if isinstance(score, str):
            raise RuntimeError(f"scoring review {review['id']} failed: {score}")
        predicted = LABELS[max(range(len(LABELS)), key=lambda i: score[i])]
        correct += predicted == review["label"]
        rows.append({"id": review["id"], "label": review["label"], "predicted": predicted, "scores": score})
    return {"accuracy": correct / len(reviews), "n": len(reviews), "items": rows}


def summarize_news(llm, news: Sequence[dict], max_tokens: int = 60) -> list[dict]:
    from prefixflow.engine import SamplingParams

    prompts = [chat(llm, SUMMARY_QUESTION.format(text=n["text"])) for n in news]
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens))
    return [
        {
            "id": n["id"],
            "summary": o.text.strip(),
            "finish_reason": o.finish_reason,
            "tokens": o.num_output_tokens,
        }
        for n, o in zip(news, outs)
    ]


def throughput_prompts(llm, n: int) -> list[str]:
    """``n`` chat prompts of mixed lengths: the labeling and summarizing questions, in turn."""
    reviews, news = read_jsonl("reviews.jsonl"), read_jsonl("news.jsonl")
    questions = [LABEL_QUESTION.format(text=r["text"]) for r in reviews]
    questions += [SUMMARY_QUESTION.format(text=x["text"]) for x in news]
    return [chat(llm, questions[i % len(questions)]) for i in range(n)]


def run_engine(llm, prompts: Sequence[str], max_tokens: int) -> tuple[float, list[list[int]]]:
    from prefixflow.engine import SamplingParams

    start = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return time.perf_counter() - start, [list(o.token_ids) for o in outs]


def run_hf(
    model, tokenizer, prompts: Sequence[str], max_tokens: int, batch_size: int
) -> tuple[float, list[list[int]]]:
    """transformers ``generate`` on left-padded static batches, in input order (no length sorting)."""
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = GenerationConfig(
        do_sample=False, max_new_tokens=max_tokens, min_new_tokens=0, eos_token_id=None, pad_token_id=pad
    )
    encoded = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    outputs: list[list[int]] = []
    start = time.perf_counter()
    for b in range(0, len(encoded), batch_size):
        batch = encoded[b : b + batch_size]
        width = max(map(len, batch))
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(batch):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        outputs += out[:, width:].tolist()
    return time.perf_counter() - start, outputs


def compare_throughput(llm, gguf_path: Path, n: int, max_tokens: int, batch_size: int) -> dict:
    from transformers import AutoModelForCausalLM

    prompts = throughput_prompts(llm, n)
    engine_s, engine_out = run_engine(llm, prompts, max_tokens)
    hf = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    hf.eval()
    hf_s, hf_out = run_hf(hf, llm.tokenizer, prompts, max_tokens, batch_size)
    tokens = n * max_tokens
    eos = {llm.tokenizer.eos_token_id}  # <|im_end|> for SmolLM2's ChatML
    same = sum(until_eos(a, eos) == until_eos(b, eos) for a, b in zip(engine_out, hf_out))
    return {
        "prompts": n,
        "prompt_tokens": sum(len(llm.tokenizer.encode(p)) for p in prompts),
        "max_tokens": max_tokens,
        "hf_batch_size": batch_size,
        "engine_s": engine_s,
        "hf_s": hf_s,
        "engine_tok_s": tokens / engine_s,
        "hf_tok_s": tokens / hf_s,
        "speedup": hf_s / engine_s,
        "identical_until_eos": same,
    }


def until_eos(tokens: Sequence[int], eos: set[int]) -> list[int]:
    """The answer proper: tokens after an end-of-turn token (EOS is ignored to fix the length) are noise."""
    for i, t in enumerate(tokens):
        if t in eos:
            return list(tokens[: i + 1])
    return list(tokens)


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on CPU)")
    ap.add_argument("--summary-tokens", type=int, default=60)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per request in the throughput run")
    ap.add_argument("--batch-size", type=int, default=16, help="transformers static batch size")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    setup_threads(args.threads)

    from prefixflow.engine import LLM
    from prefixflow.engine.loading.embedded import resolve_embedded

    start = time.perf_counter()
    llm = LLM(model=MODEL, dtype=args.dtype)
    result: dict = {"model": MODEL, "dtype": args.dtype, "load_s": time.perf_counter() - start}
    result["environment"] = environment()

    start = time.perf_counter()
    labels = label_reviews(llm, read_jsonl("reviews.jsonl"))
    labels["elapsed_s"] = time.perf_counter() - start
    result["labeling"] = labels
    start = time.perf_counter()
    result["summaries"] = summarize_news(llm, read_jsonl("news.jsonl"), args.summary_tokens)
    result["summaries_elapsed_s"] = time.perf_counter() - start

    print_table(
        [
            {
                "task": "review sentiment",
                "n": labels["n"],
                "accuracy": labels["accuracy"],
                "s": labels["elapsed_s"],
            }
        ],
        ["task", "n", "accuracy", "s"],
        title=f"{MODEL} ({args.dtype}, {torch.get_num_threads()} threads)",
    )
    print("news summaries (greedy)")
    for item in result["summaries"]:
        print(f"  {item['id']}  {item['summary']}")
    if not args.skip_throughput:
        t = compare_throughput(
            llm, resolve_embedded(MODEL), args.num_prompts, args.max_tokens, args.batch_size
        )
        result["throughput"] = t
        rows = [
            {"engine": "prefixflow", "s": t["engine_s"], "tok/s": t["engine_tok_s"], "ratio": t["speedup"]},
            {
                "engine": f"hf generate (bs={args.batch_size})",
                "s": t["hf_s"],
                "tok/s": t["hf_tok_s"],
                "ratio": 1.0,
            },
        ]
        print_table(
            rows,
            ["engine", "s", "tok/s", "ratio"],
            title=f"throughput: {t['prompts']} chat prompts, {t['max_tokens']} tokens each, greedy "
            f"({t['identical_until_eos']}/{t['prompts']} answers identical up to EOS)",
        )
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

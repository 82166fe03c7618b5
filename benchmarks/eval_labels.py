"""Labeling quality of the embedded SmolLM2-135M-Instruct on the project's own labeled sets: raw
scoring against each calibration method, two prompt styles, sum against mean log-prob.

Sets (benchmarks/data, written for the project): ``tickets`` (100 support messages, 4 balanced
categories), ``news`` (80 news snippets, 4 balanced topics, labels of 1 to 3 tokens), ``reviews``
(the 60 two-class product reviews of eval_smollm2). Prompts are built by the pipeline's own code
(``parse_job_config`` + ``RowPreparer``) and every method is the pipeline's own math
(``label_scoring``): the log-probabilities of all labels' surface forms on the rows and on every
reference prompt are computed once per (set, style), then each method is evaluated on them.
``batch`` (each label's mean probability over a sample of the job's rows divided out, Zhou et al.,
ICLR 2024, ``label_scoring.batch_bias``; with these sets' sizes its 256-row sample is every row),
``batch+contextual`` (the same on top of contextual: the pipeline's default since issue 26), and batch estimated from every third row
only; label-order permutation averaging is measured for comparison (the pipeline does not offer it).
``--pipeline`` also runs the default job end to end (``run_local``) for each style; ``--cost`` runs
it with ``calibration: none``, ``contextual`` and ``batch`` on a fresh engine each (an empty prefix
cache) and records the prompt tokens the engine computed, so the extra cost of each calibration is exact.

    python -m benchmarks.eval_labels --json benchmarks/results/cpu_eval_labels.json --pipeline
    python -m benchmarks.eval_labels --styles chat,plain --no-permute --pipeline --cost \
        --json benchmarks/results/cpu_eval_labels_batch.json          # issue 26
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import environment, print_table, setup_threads, write_json
from benchmarks.label_metrics import label_metrics
from prefixflow.pipeline.job.config import LabelConfig

MODEL = "smollm2-135m-instruct"
DATA = Path(__file__).parent / "data"


@dataclass(frozen=True)
class Style:
    """One way to write the job: ``template`` has ``{labels}`` where a chat prompt lists the labels."""

    name: str
    template: str
    chat: str
    choice_prefix: str
    system_prompt: str | None = None
    permute: bool = False  # also measure label-order permutation averaging (chat styles that list labels)


@dataclass(frozen=True)
class LabelSet:
    name: str
    file: str
    labels: tuple[str, ...]
    styles: tuple[Style, ...] = field(default_factory=tuple)


TICKET_DESCRIPTIONS = (
    "- billing: payments, charges, refunds, invoices, prices\n"
    "- shipping: delivery, parcels, tracking, couriers, returns\n"
    "- technical: bugs, errors, crashes, devices, apps not working\n"
    "- account: login, password, profile, email address, users and access\n"
)
SETS = (
    LabelSet(
        "tickets",
        "tickets.jsonl",
        ("billing", "shipping", "technical", "account"),
        (
            Style(
                "chat",
                "Classify this customer support message into one of these categories: {labels}. "
                "Answer with the category only.\n\nMessage: {{{{ text }}}}",
                "on",
                "",
                permute=True,
            ),
            Style(
                "chat-described",
                "Classify this customer support message into one of these categories:\n"
                + TICKET_DESCRIPTIONS
                + "Answer with the category only.\n\nMessage: {{{{ text }}}}",
                "on",
                "",
                system_prompt="You sort customer support messages into categories.",
            ),
            Style(
                "plain", "Customer message: {{{{ text }}}}\nThe message is about a problem with", "off", " "
            ),
            Style("plain-category", "Support ticket: {{{{ text }}}}\nCategory:", "off", " "),
        ),
    ),
    LabelSet(
        "news",
        "news_topics.jsonl",
        ("sports", "politics", "science and technology", "business and finance"),
        (
            Style(
                "chat",
                "Classify this news snippet into one of these topics: {labels}. "
                "Answer with the topic only.\n\nNews: {{{{ text }}}}",
                "on",
                "",
            ),
            Style("plain", "News: {{{{ text }}}}\nThis news story is about", "off", " "),
        ),
    ),
    LabelSet(
        "reviews",
        "reviews.jsonl",
        ("positive", "negative"),
        (
            Style(
                "chat",
                "Is the sentiment of this product review positive or negative? Answer with one word."
                "\n\nReview: {{{{ text }}}}",
                "on",
                "",
            ),
            Style(
                "plain",
                "Review: {{{{ text }}}}\nOverall, the reviewer's opinion of the product is",
                "off",
                " ",
            ),
        ),
    ),
)
CONTENT_FREE = ("N/A", "", "[MASK]")  # Zhao et al. 2021's three, each also measured alone
DEFAULT_CONTENT_FREE = LabelConfig().content_free  # the pipeline's default


def read_jsonl(name: str) -> list[dict]:
    with (DATA / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def job_dict(label_set: LabelSet, style: Style, order: Sequence[str] | None = None, **label: Any) -> dict:
    listed = ", ".join(order or label_set.labels)
    job = {
        "task": "label",
        "id_column": "id",
        "template": style.template.format(labels=listed),
        "chat": style.chat,
        "label": {"labels": list(label_set.labels), "choice_prefix": style.choice_prefix, **label},
    }
    if style.system_prompt:
        job["system_prompt"] = style.system_prompt
    return job


def score_style(llm, label_set: LabelSet, style: Style, rows: list[dict], order=None) -> dict:
    """Log-probabilities of every surface form (as written and case-flipped) on the rows, on each
    content-free input and on the domain premise, with their token counts."""
    from prefixflow.pipeline.job.spec import parse_job_config
    from prefixflow.pipeline.tasks.label.references import content_free_text, domain_premise
    from prefixflow.pipeline.tasks.label.scoring import label_choices
    from prefixflow.pipeline.tasks.registry import task_of
    from prefixflow.pipeline.tasks.rows import RowPreparer

    cfg = parse_job_config(job_dict(label_set, style, order, case_variants=True))
    prep = RowPreparer(cfg, llm, {}, task_of(cfg))
    choices = list(label_choices(cfg).choices)
    prompts = [prep.prepare(r, {"id": r["id"]}, "eval", i).prompt_ids for i, r in enumerate(rows)]
    refs = {f"cf:{v}": prep.encode_reference(content_free_text(prep.template, v)) for v in CONTENT_FREE}
    premise = prep.encode_reference(domain_premise(prep.template))
    if premise:
        refs["domain"] = premise
    all_prompts = prompts + list(refs.values())
    usage: list[dict] = []
    scores = llm.score_choices(all_prompts, [choices] * len(all_prompts), usage=usage)
    bad = [s for s in scores if isinstance(s, str)]
    if bad:
        raise RuntimeError(f"{label_set.name}/{style.name}: scoring failed: {bad[:3]}")
    tokens = [u["choice_tokens"] for u in usage]
    n = len(prompts)
    return {
        "choices": choices,
        "rows": scores[:n],
        "row_tokens": tokens[:n],
        "refs": {k: (scores[n + i], tokens[n + i]) for i, k in enumerate(refs)},
    }


def method_probs(
    label_set: LabelSet,
    style: Style,
    raw: dict,
    method: str,
    norm: str,
    case: bool,
    rows: Sequence[int] | None = None,
) -> list[list[float]]:
    """Label distributions of ``rows`` (all when None) under one method, from the raw scores."""
    from prefixflow.pipeline.tasks.label.scoring import (
        LabelChoices,
        batch_bias,
        calibrated_probs,
        reference_bias,
    )

    ch = LabelChoices.build(label_set.labels, style.choice_prefix, case)
    where = {c: i for i, c in enumerate(raw["choices"])}
    pick = [where[c] for c in ch.choices]

    def per_label(lp: Sequence[float], tok: Sequence[int]) -> list[float]:
        return ch.label_scores([lp[i] for i in pick], [tok[i] for i in pick], norm)

    index = range(len(raw["rows"])) if rows is None else rows
    scores = [per_label(raw["rows"][i], raw["row_tokens"][i]) for i in index]

    def references(keys: Sequence[str]) -> list[float] | None:
        return reference_bias([per_label(*raw["refs"][k]) for k in keys if k in raw["refs"]])

    contextual = [f"cf:{v}" for v in DEFAULT_CONTENT_FREE]
    if method == "none":
        bias = None
    elif method == "batch":  # the pipeline's estimate: sampled rows = every row here (256 > the set)
        bias = batch_bias(scores, None)
    elif method == "batch-third":  # the estimate from every third row only
        bias = batch_bias(scores[::3], None)
    elif method == "batch+contextual":
        bias = batch_bias(scores, references(contextual))
    else:
        keys = {
            "contextual": [f"cf:{v}" for v in DEFAULT_CONTENT_FREE],
            "contextual-3": [f"cf:{v}" for v in CONTENT_FREE],
        }.get(method, [method])
        bias = reference_bias([per_label(*raw["refs"][k]) for k in keys if k in raw["refs"]])
    return [calibrated_probs(s, bias) for s in scores]


# (row name, method, length norm, case variants): what each table row measures
METHODS = (
    ("raw (before issue 14)", "none", "sum", False),
    ("none + case", "none", "sum", True),
    ("contextual", "contextual", "sum", False),
    ("contextual + case (default until issue 26)", "contextual", "sum", True),
    ("contextual + case, mean", "contextual", "mean", True),
    ("contextual N/A,'',[MASK] + case", "contextual-3", "sum", True),
    ("contextual 'N/A' only + case", "cf:N/A", "sum", True),
    ("contextual '' only + case", "cf:", "sum", True),
    ("contextual '[MASK]' only + case", "cf:[MASK]", "sum", True),
    ("domain + case", "domain", "sum", True),
    ("domain + case, mean", "domain", "mean", True),
    ("batch + case", "batch", "sum", True),
    ("batch+contextual + case (default, issue 26)", "batch+contextual", "sum", True),
    ("batch + case, every 3rd row as the sample", "batch-third", "sum", True),
)
DEFAULT_METHOD = "batch+contextual + case (default, issue 26)"
METHOD_OF = {
    "batch": "batch + case",
    "batch+contextual": DEFAULT_METHOD,
    "contextual": "contextual + case (default until issue 26)",
}  # pipeline calibration -> row name


def evaluate_style(llm, label_set: LabelSet, style: Style, rows: list[dict], permute: bool = True) -> dict:
    gold = [label_set.labels.index(r["label"]) for r in rows]
    k = len(label_set.labels)
    start = time.perf_counter()
    raw = score_style(llm, label_set, style, rows)
    out: dict[str, Any] = {"scoring_s": time.perf_counter() - start, "methods": {}, "raw": raw}
    for name, method, norm, case in METHODS:
        if method == "domain" and "domain" not in raw["refs"]:
            continue
        probs = method_probs(label_set, style, raw, method, norm, case)
        out["methods"][name] = label_metrics(gold, probs, k)
    out["imbalanced"] = imbalanced(label_set, style, raw, gold)
    if style.permute and permute:
        out["methods"].update(permutations(llm, label_set, style, rows, gold))
    return out


def imbalanced(label_set: LabelSet, style: Style, raw: dict, gold: list[int], minority: int = 8) -> dict:
    """Contextual against batch calibration when the first label holds half the rows: every row of it,
    ``minority`` rows of each other label. Batch calibration assumes balanced classes."""
    seen = [0] * len(label_set.labels)
    keep = []
    for i, g in enumerate(gold):
        if g == 0 or seen[g] < minority:
            keep.append(i)
            seen[g] += 1
    sub = [gold[i] for i in keep]
    result = {"rows": len(keep), "first_label_share": sub.count(0) / len(sub)}
    for method in ("contextual", "batch", "batch+contextual"):
        probs = method_probs(label_set, style, raw, method, "sum", True, rows=keep)
        result[method] = label_metrics(sub, probs, len(label_set.labels))
    return result


def permutations(llm, label_set: LabelSet, style: Style, rows: list[dict], gold: list[int]) -> dict:
    """Average the label distributions over the cyclic shifts of the listed label order."""
    labels, k = label_set.labels, len(label_set.labels)
    runs = [score_style(llm, label_set, style, rows, order=labels[i:] + labels[:i]) for i in range(k)]
    out = {}
    for name, method in (
        ("permutation average + case", "none"),
        ("permutation average + contextual + case", "contextual"),
    ):
        per_run = [method_probs(label_set, style, raw, method, "sum", True) for raw in runs]
        probs = [[sum(run[i][j] for run in per_run) / k for j in range(k)] for i in range(len(rows))]
        out[name] = label_metrics(gold, probs, k)
    return out


def overhead(
    model: str,
    dtype: str,
    label_set: LabelSet,
    style: Style,
    rows: list[dict],
    repeats: int,
    modes: Sequence[str] = ("none", "contextual"),
) -> dict:
    """What calibration costs: the default job with each calibration of ``modes``, each on a fresh
    engine (an empty prefix cache), interleaved ``repeats`` times: prompt tokens the engine computed
    (exact), wall time and process CPU-seconds (min, median); ``runs[mode]``: the last run's metrics."""
    import os
    import statistics

    from prefixflow.engine import LLM

    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    last: dict[str, dict] = {}
    for _ in range(repeats):
        for mode in runs:
            llm = LLM(model=model, dtype=dtype)
            cpu = time.process_time()
            res = pipeline_run(llm, model, label_set, style, rows, calibration=mode)
            runs[mode].append(
                {
                    "s": res["elapsed_s"],
                    "cpu_s": time.process_time() - cpu,
                    "computed": llm.stats().computed_prompt_tokens,
                }
            )
            last[mode] = res
    out: dict[str, Any] = {}
    for mode, rs in runs.items():
        times, cpus = [r["s"] for r in rs], [r["cpu_s"] for r in rs]
        out[mode] = {
            "computed_prompt_tokens": rs[0]["computed"],
            "min_s": min(times),
            "median_s": statistics.median(times),
            "min_cpu_s": min(cpus),
            "median_cpu_s": statistics.median(cpus),
        }
    out["loadavg"] = os.getloadavg()
    out["runs"] = last
    return out


def sample_tokens(llm, label_set: LabelSet, style: Style, rows: list[dict]) -> dict:
    """What batch calibration's sample adds: its rows (the default 256 cover these sets whole), their
    prompt tokens (each counted once) and the scoring requests (one per row and label choice)."""
    from prefixflow.pipeline.job.spec import parse_job_config
    from prefixflow.pipeline.tasks.label.scoring import label_choices
    from prefixflow.pipeline.tasks.registry import task_of
    from prefixflow.pipeline.tasks.rows import RowPreparer

    cfg = parse_job_config(job_dict(label_set, style))
    prep = RowPreparer(cfg, llm, {}, task_of(cfg))
    sampled = rows[: cfg.label.calibration_rows]
    tokens = sum(len(prep.prepare(r, {"id": r["id"]}, "eval", i).prompt_ids) for i, r in enumerate(sampled))
    return {
        "rows": len(sampled),
        "prompt_tokens": tokens,
        "requests": len(sampled) * len(label_choices(cfg).choices),
    }


def pipeline_run(llm, model: str, label_set: LabelSet, style: Style, rows: list[dict], **label: Any) -> dict:
    """The default job (no label options beyond labels and choice_prefix, unless given) through run_local."""
    import polars as pl

    from prefixflow.pipeline import load_job
    from prefixflow.pipeline.local_run import run_local

    with tempfile.TemporaryDirectory() as tmp:
        pl.DataFrame(rows).write_parquet(f"{tmp}/in.parquet")
        spec = load_job(f"{tmp}/in.parquet", f"{tmp}/out", model, job_dict(label_set, style, **label))
        start = time.perf_counter()
        summary, failures = run_local(spec, llm=llm, progress=False)
        elapsed = time.perf_counter() - start
        df = pl.read_parquet(summary.data_glob).sort("row_index")
    if failures or summary.error_rows:
        raise RuntimeError(f"pipeline run failed: {failures} {summary.errors_by_class}")
    labels = label_set.labels
    probs = [[p[lb] for lb in labels] for p in df["label_probs"].to_list()]
    gold = [labels.index(r["label"]) for r in rows]
    return {
        **label_metrics(gold, probs, len(labels)),
        "elapsed_s": elapsed,
        "prefix_hit_rate": summary.prefix_hit_rate,
        "calibration": summary.label_calibration,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=MODEL, help="any model argument (the smoke test uses tiny)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--limit", type=int, default=None, help="first N rows of each set (smoke runs)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on CPU)")
    ap.add_argument("--sets", default=",".join(s.name for s in SETS))
    ap.add_argument("--pipeline", action="store_true", help="also run the default job end to end per style")
    ap.add_argument(
        "--overhead",
        type=int,
        default=0,
        metavar="REPEATS",
        help="only measure what calibration costs on tickets/chat (fresh engines, interleaved)",
    )
    ap.add_argument("--styles", default=None, help="only these prompt styles (e.g. chat,plain)")
    ap.add_argument("--no-permute", action="store_true", help="skip label-order permutation averaging")
    ap.add_argument(
        "--cost",
        action="store_true",
        help="per style: the job with calibration none / contextual / batch on fresh engines",
    )
    ap.add_argument(
        "--cost-only",
        action="store_true",
        help="only the --cost runs (no method table): computed prompt tokens per calibration",
    )
    ap.add_argument("--raw", default=None, help="also write every raw log-probability here (JSON)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    setup_threads(args.threads)
    from prefixflow.engine import LLM

    result: dict[str, Any] = {
        "model": args.model,
        "dtype": args.dtype,
        "environment": environment(),
        "sets": {},
    }
    if args.overhead:
        tickets = SETS[0]
        rows = read_jsonl(tickets.file)[: args.limit]
        result["overhead"] = overhead(
            args.model,
            args.dtype,
            tickets,
            tickets.styles[0],
            rows,
            args.overhead,
            ("none", "contextual", "batch+contextual"),
        )
        result["overhead"].pop("runs")
        print(json.dumps(result["overhead"], indent=1))
        write_json(args.json, result)
        return result
    llm = None if args.cost_only else LLM(model=args.model, dtype=args.dtype)
    for label_set in (s for s in SETS if s.name in args.sets.split(",")):
        rows = read_jsonl(label_set.file)[: args.limit]
        result["sets"][label_set.name] = per_style = {}
        for style in label_set.styles:
            if args.styles and style.name not in args.styles.split(","):
                continue
            if args.cost_only:
                per_style[style.name] = cost = overhead(
                    args.model,
                    args.dtype,
                    label_set,
                    style,
                    rows,
                    1,
                    ("none", "contextual", "batch", "batch+contextual"),
                )
                cost.pop("runs")
                print(
                    f"{label_set.name}/{style.name}: computed prompt tokens (fresh engine): "
                    + ", ".join(
                        f"{m} {cost[m]['computed_prompt_tokens']:,} ({cost[m]['median_cpu_s']:.1f} CPU-s)"
                        for m in ("none", "contextual", "batch", "batch+contextual")
                    ),
                    flush=True,
                )
                continue
            res = evaluate_style(llm, label_set, style, rows, permute=not args.no_permute)
            if args.cost:
                res["cost"] = overhead(
                    args.model, args.dtype, label_set, style, rows, 1, ("none", "contextual", "batch")
                )
                res["pipeline_default"] = res["cost"].pop("runs")["batch"]
            elif args.pipeline:
                res["pipeline_default"] = pipeline_run(llm, args.model, label_set, style, rows)
            res["sample_prompt_tokens"] = sample_tokens(llm, label_set, style, rows)
            per_style[style.name] = res
            table = [
                {"method": m, **{k: v for k, v in r.items() if k != "n"}} for m, r in res["methods"].items()
            ]
            if "pipeline_default" in res:
                table.append({"method": "pipeline default (run_local)", **res["pipeline_default"]})
            print_table(
                table,
                ["method", "accuracy", "macro_f1", "largest_share", "ece", "predicted"],
                title=f"{label_set.name} / {style.name}: {len(rows)} rows, chance "
                f"{1 / len(label_set.labels):.2f}",
            )
            imb = res["imbalanced"]
            print(
                f"  imbalanced subset ({imb['rows']} rows, first label {imb['first_label_share']:.0%}): "
                f"contextual acc {imb['contextual']['accuracy']:.3f}, batch acc {imb['batch']['accuracy']:.3f}, "
                f"batch+contextual acc {imb['batch+contextual']['accuracy']:.3f}"
            )
            if "cost" in res:
                print(
                    "  computed prompt tokens (fresh engine): "
                    + ", ".join(
                        f"{m} {res['cost'][m]['computed_prompt_tokens']:,}"
                        for m in ("none", "contextual", "batch")
                    )
                )
    raw = {
        f"{name}/{style}": res.pop("raw")
        for name, per in result["sets"].items()
        for style, res in per.items()
        if "raw" in res
    }
    write_json(args.raw, raw)
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

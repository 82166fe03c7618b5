"""``label.mode: constrained`` quality on the labeled sets of eval_labels, per calibration (issue 26).

Constrained rows are generated under the label grammar with each calibration applied as a logit bias
on the labels' first tokens, exactly as the pipeline does (``FirstTokens``, ``with_logit_bias``,
``RowPreparer.params``): ``none``; ``contextual`` (the content-free references' first-token
distribution); ``batch`` (the first tokens' mean probability over the rows: the pipeline's 256-row
sample is every row of these sets); ``batch+contextual`` (the pipeline's default). For comparison,
``batch (whole labels)`` takes the estimate score mode makes (each whole label's mean probability,
no case variants) and puts it on the first tokens instead: the method not chosen. Score mode's
default on the same prompts is the reference line. ``--pipeline`` also runs the default constrained
job end to end (``run_local``). Prompt tokens: what the estimate scores besides the rows (the sampled
rows' prompts, each once; one one-token scoring request per distinct first token).

    python -m benchmarks.eval_labels_constrained --styles chat,plain --threads 1 --pipeline \
        --json benchmarks/results/cpu_eval_labels_constrained.json
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.common import environment, print_table, setup_threads, write_json
from benchmarks.eval_labels import MODEL, SETS, LabelSet, Style, job_dict, read_jsonl
from benchmarks.label_metrics import label_metrics

METHODS = ("none", "contextual", "batch", "batch+contextual", "batch (whole labels)")


def _scores(llm, prompts: list[list[int]], choices: Sequence[Any], per_label) -> list[list[float]]:
    out = []
    usage: list[dict] = []
    for score, use in zip(llm.score_choices(prompts, [list(choices)] * len(prompts), usage=usage), usage):
        if isinstance(score, str):
            raise RuntimeError(f"scoring failed: {score}")
        out.append(per_label(score, use["choice_tokens"]))
    return out


def biases(llm, cfg, prep, prompts: list[list[int]]) -> dict[str, list[float] | None]:
    """Per method, the per-label log correction the rows' first tokens lose (None: no bias)."""
    from prefixflow.pipeline.tasks.label.first_tokens import FirstTokens
    from prefixflow.pipeline.tasks.label.references import reference_texts
    from prefixflow.pipeline.tasks.label.scoring import LabelChoices, batch_bias, reference_bias

    first = FirstTokens.build(cfg, prep.tok)
    refs = [prep.encode_reference(t) for t in reference_texts(cfg, prep.template)[0]]
    group = _scores(llm, prompts + refs, first.choices, lambda s, _: list(s))
    rows, ref = group[: len(prompts)], group[len(prompts) :]
    contextual = reference_bias(ref)
    whole = LabelChoices.build(cfg.label.labels, cfg.label.choice_prefix, False)
    label_rows = _scores(llm, prompts, whole.choices, lambda s, t: whole.label_scores(s, t, "sum"))
    return {
        "none": None,
        "contextual": None if contextual is None else first.per_label(contextual),
        "batch": first.per_label(batch_bias(rows, None)),
        "batch+contextual": first.per_label(batch_bias(rows, contextual)),
        "batch (whole labels)": batch_bias(label_rows, None),
    }


def evaluate(llm, label_set: LabelSet, style: Style, rows: list[dict]) -> dict[str, Any]:
    from prefixflow.pipeline.job.spec import parse_job_config
    from prefixflow.pipeline.tasks.label.first_tokens import FirstTokens, with_logit_bias
    from prefixflow.pipeline.tasks.label.task import constrained_label
    from prefixflow.pipeline.tasks.registry import task_of
    from prefixflow.pipeline.tasks.rows import RowPreparer

    cfg = parse_job_config(job_dict(label_set, style, mode="constrained"))
    prep = RowPreparer(cfg, llm, {}, task_of(cfg))
    prepared = [prep.prepare(r, {"id": r["id"]}, "eval", i) for i, r in enumerate(rows)]
    prompts = [p.prompt_ids for p in prepared]
    labels = label_set.labels
    gold = [labels.index(r["label"]) for r in rows]
    first = FirstTokens.build(cfg, prep.tok)
    out: dict[str, Any] = {"first_tokens": [prep.tok.decode([t]) for t in first.tokens], "methods": {}}
    start = time.perf_counter()
    per_method = biases(llm, cfg, prep, prompts)
    out["estimate_s"] = time.perf_counter() - start
    out["sample_prompt_tokens"] = sum(len(p) for p in prompts)
    out["sample_requests"] = len(prompts) * len(first.tokens)
    for method in METHODS:
        bias = per_method[method]
        todo = prepared if bias is None else with_logit_bias(prepared, first.logit_bias(bias))
        cpu = time.process_time()
        outs = llm.generate([p.prompt_ids for p in todo], [p.params for p in todo])
        found = [constrained_label(o.text, cfg) for o in outs]
        onehot = [[1.0 if lb == f else 0.0 for lb in labels] if f else [0.0] * len(labels) for f in found]
        out["methods"][method] = {
            **label_metrics(gold, onehot, len(labels)),
            "unparsed": found.count(None),
            "generate_cpu_s": time.process_time() - cpu,
        }
        out["methods"][method].pop("ece")  # one label per row, no probabilities
    return out


def pipeline_run(llm, model: str, label_set: LabelSet, style: Style, rows: list[dict]) -> dict[str, Any]:
    """The default constrained job (batch+contextual) through run_local."""
    import polars as pl

    from prefixflow.pipeline import load_job
    from prefixflow.pipeline.local_run import run_local

    with tempfile.TemporaryDirectory() as tmp:
        pl.DataFrame(rows).write_parquet(f"{tmp}/in.parquet")
        spec = load_job(
            f"{tmp}/in.parquet", f"{tmp}/out", model, job_dict(label_set, style, mode="constrained")
        )
        summary, failures = run_local(spec, llm=llm, progress=False)
        df = pl.read_parquet(summary.data_glob).sort("row_index")
    if failures:
        raise RuntimeError(f"pipeline run failed: {failures}")
    labels = label_set.labels
    onehot = [[1.0 if lb == f else 0.0 for lb in labels] for f in df["label"].to_list()]
    metrics = label_metrics([labels.index(r["label"]) for r in rows], onehot, len(labels))
    metrics.pop("ece")
    return {**metrics, "calibration": summary.label_calibration}


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sets", default=",".join(s.name for s in SETS))
    ap.add_argument("--styles", default="chat,plain")
    ap.add_argument("--pipeline", action="store_true", help="also run the default constrained job end to end")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    setup_threads(args.threads)
    from prefixflow.engine import LLM

    result: dict[str, Any] = {
        "model": args.model,
        "environment": environment(),
        "loadavg_start": os.getloadavg(),
        "sets": {},
    }
    llm = LLM(model=args.model, dtype=args.dtype)
    for label_set in (s for s in SETS if s.name in args.sets.split(",")):
        rows = read_jsonl(label_set.file)[: args.limit]
        per_style = result["sets"][label_set.name] = {}
        for style in (s for s in label_set.styles if s.name in args.styles.split(",")):
            res = evaluate(llm, label_set, style, rows)
            if args.pipeline:
                res["pipeline_default"] = pipeline_run(llm, args.model, label_set, style, rows)
            per_style[style.name] = res
            table = [{"method": m, **r} for m, r in res["methods"].items()]
            if "pipeline_default" in res:
                table.append({"method": "pipeline default (run_local)", **res["pipeline_default"]})
            print_table(
                table,
                ["method", "accuracy", "macro_f1", "largest_share", "unparsed", "predicted"],
                title=f"constrained {label_set.name} / {style.name}: {len(rows)} rows, first tokens "
                f"{res['first_tokens']}",
            )
    result["loadavg_end"] = os.getloadavg()
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

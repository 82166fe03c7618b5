"""Run prepared rows through the engine and yield finished output records as they complete.

generate/summarize stream from ``llm.generate_stream``; label/score is labeling.py (calibrated
``llm.score_choices`` in batches); map_reduce rows summarize their chunks, then the joined chunk summaries.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

from prefixflow.pipeline.engine_access import Engine, Output
from prefixflow.pipeline.errors import (
    ENGINE_ERROR,
    LABEL_PARSE_ERROR,
    PROMPT_TOO_LONG,
    RowError,
)
from prefixflow.pipeline.job.config import JobConfig, LabelConfig
from prefixflow.pipeline.run.output_schema import error_record
from prefixflow.pipeline.tasks.extract import Extraction
from prefixflow.pipeline.tasks.label.labeling import constrained_rows, score_labels
from prefixflow.pipeline.tasks.rows import Prepared, RowPreparer

MAX_REDUCE_ROUNDS = 3


def _finished(p: Prepared, out: Output, cfg: JobConfig, extraction: Extraction | None = None) -> dict[str, Any]:
    counts = {
        "prompt_tokens": out.num_prompt_tokens,
        "cached_tokens": out.num_cached_tokens,
        "output_tokens": out.num_output_tokens,
        "latency_s": float(out.latency or 0.0),
    }
    if out.finish_reason == "error":
        return error_record(p.base, ENGINE_ERROR, out.error or "engine error", **counts)
    text = _valid_utf8(out.text)
    rec = {**p.base, **counts, "output": text, "finish_reason": out.finish_reason}
    if out.samples:  # n > 1
        rec["samples"] = [{"text": _valid_utf8(s.text), "finish_reason": s.finish_reason,
                           "output_tokens": len(s.token_ids)} for s in out.samples]  # fmt: skip
    if extraction is not None:
        value, error_class, problem = extraction.parse(text, out.finish_reason)
        if error_class is not None:
            return {**rec, "finish_reason": "error", "error_class": error_class, "error": problem}
        rec["extracted"] = value
    elif cfg.task == "label" and cfg.label.mode == "constrained":
        label = constrained_label(text, cfg.label)
        if label is None:
            return {**rec, "finish_reason": "error", "error_class": LABEL_PARSE_ERROR,
                    "error": f"output is not one of the labels (finish_reason {out.finish_reason})"}  # fmt: skip
        rec["label"] = label
    elif cfg.task == "label":
        label = parse_label(text, cfg.label.labels)
        if label is None:
            allowed = ", ".join(cfg.label.labels)
            return {**rec, "finish_reason": "error", "error_class": LABEL_PARSE_ERROR,
                    "error": f"no label found in the output; expected one of: {allowed}"}  # fmt: skip
        rec["label"] = label
    return rec


def _valid_utf8(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")  # Arrow needs valid UTF-8 (no lone surrogates)


def constrained_label(text: str, label: LabelConfig) -> str | None:
    """The label a constrained generation produced (exactly ``choice_prefix + label``), if it finished."""
    return next((lb for lb in label.labels if text == label.choice_prefix + lb), None)


def parse_label(text: str, labels: tuple[str, ...]) -> str | None:
    """The label named earliest in the text (whole word, case-insensitive; longer labels win ties)."""
    best: tuple[int, int, str] | None = None
    for label in labels:
        m = re.search(rf"(?<!\w){re.escape(label)}(?!\w)", text, flags=re.IGNORECASE)
        if m and (best is None or (m.start(), -len(label)) < best[:2]):
            best = (m.start(), -len(label), label)
    return best[2] if best else None


def stream_generate(llm: Engine, cfg: JobConfig, rows: list[Prepared]) -> Iterator[dict[str, Any]]:
    if not rows:
        return
    outs = llm.generate_stream([p.prompt_ids for p in rows], [p.params for p in rows],
                               request_ids=[str(i) for i in range(len(rows))])  # fmt: skip
    extraction = Extraction(cfg.schema) if cfg.task == "extract" and cfg.schema is not None else None
    for out in outs:
        yield _finished(rows[int(out.request_id)], out, cfg, extraction)


def map_reduce(llm: Engine, prep: RowPreparer, rows: list[Prepared]) -> Iterator[dict[str, Any]]:
    """Summarize each row's chunks, then summarize the joined summaries (re-chunking if still long)."""
    totals = {
        id(p): {"prompt_tokens": 0, "cached_tokens": 0, "output_tokens": 0, "latency_s": 0.0} for p in rows
    }
    pending = list(rows)
    for _ in range(MAX_REDUCE_ROUNDS):
        prompts, owners = [], []
        for p in pending:
            prompts += p.chunks
            owners += [p] * len(p.chunks)
        outs = llm.generate(prompts, [o.params for o in owners]) if prompts else []
        summaries: dict[int, list[str]] = {id(p): [] for p in pending}
        failed: dict[int, str] = {}
        for o, out in zip(owners, outs):
            t = totals[id(o)]
            t["prompt_tokens"] += out.num_prompt_tokens
            t["cached_tokens"] += out.num_cached_tokens
            t["output_tokens"] += out.num_output_tokens
            t["latency_s"] += float(out.latency or 0.0)
            if out.finish_reason == "error":
                failed[id(o)] = out.error or "engine error"
            summaries[id(o)].append(out.text.strip())
        next_round = []
        finals: list[tuple[Prepared, list[int]]] = []
        for p in pending:
            if id(p) in failed:
                yield error_record(p.base, ENGINE_ERROR, f"map step: {failed[id(p)]}", **totals[id(p)])
                continue
            try:
                ids = prep.reduce_prompt(p.row, summaries[id(p)], p.params)
                if ids is not None:
                    finals.append((p, ids))
                    continue
                joined = prep.tok.encode("\n".join(summaries[id(p)]), add_special_tokens=False)
                room = prep.budget(p.params) // 2
                p.chunks = [prep.fit(p.row, joined[i : i + room], room, prep.budget(p.params))
                            for i in range(0, len(joined), room)]  # fmt: skip
            except RowError as err:  # e.g. empty summaries, a reduce template that fails on this row
                yield error_record(p.base, err.error_class, f"reduce step: {err.message}", **totals[id(p)])
                continue
            next_round.append(p)
        yield from _reduce(llm, prep.cfg, finals, totals)
        pending = next_round
        if not pending:
            return
    for p in pending:
        yield error_record(p.base, PROMPT_TOO_LONG, "map_reduce did not converge", **totals[id(p)])


def _reduce(
    llm: Engine, cfg: JobConfig, finals: list[tuple[Prepared, list[int]]], totals: dict[int, dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    if not finals:
        return
    outs = llm.generate([ids for _, ids in finals], [p.params for p, _ in finals])
    for (p, _), out in zip(finals, outs):
        rec = _finished(p, out, cfg)
        t = totals[id(p)]
        for k in ("prompt_tokens", "cached_tokens", "output_tokens", "latency_s"):
            rec[k] = rec[k] + t[k]
        yield rec


def execute(
    llm: Engine, prep: RowPreparer, rows: list[Prepared], batch: int, label_bias: Sequence[float] | None | str = "shard"
) -> Iterator[dict[str, Any]]:
    """All prepared rows of a shard, finished records in completion order (``label_bias``: see
    labeling.score_labels)."""
    cfg = prep.cfg
    single = [p for p in rows if p.prompt is not None]
    if cfg.task == "label" and cfg.label.mode == "score":
        yield from score_labels(llm, prep, single, batch, label_bias)
    elif cfg.task == "label" and cfg.label.mode == "constrained":
        yield from stream_generate(llm, cfg, constrained_rows(llm, prep, single, label_bias))
    else:
        yield from stream_generate(llm, cfg, single)
    yield from map_reduce(llm, prep, [p for p in rows if p.prompt is None])

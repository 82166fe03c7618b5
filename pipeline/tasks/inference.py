"""Run prepared rows through the engine and yield finished output records as they complete.

Each task runs its single-prompt rows (``Task.run``: most stream from ``llm.generate_stream``; label
scoring is labeling.py, calibrated ``llm.score_choices`` in batches) and turns each generation into row
values (``Task.output_parser``); map_reduce rows summarize their chunks, then the joined chunk summaries.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prefixflow.pipeline.engine_access import Engine, Output
from prefixflow.pipeline.errors import ENGINE_ERROR, PROMPT_TOO_LONG, RowError
from prefixflow.pipeline.tasks.output_schema import error_record
from prefixflow.pipeline.tasks.rows import Prepared, RowPreparer

MAX_REDUCE_ROUNDS = 3


def _finished(p: Prepared, out: Output, prep: RowPreparer) -> dict[str, Any]:
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
        rec["samples"] = [
            {"text": _valid_utf8(s.text), "finish_reason": s.finish_reason, "output_tokens": len(s.token_ids)}
            for s in out.samples
        ]
    return prep.parse_output(rec, text, out.finish_reason) if prep.parse_output is not None else rec


def _valid_utf8(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")  # Arrow needs valid UTF-8 (no lone surrogates)


def stream_generate(llm: Engine, prep: RowPreparer, rows: list[Prepared]) -> Iterator[dict[str, Any]]:
    if not rows:
        return
    outs = llm.generate_stream(
        [p.prompt_ids for p in rows], [p.params for p in rows], request_ids=[str(i) for i in range(len(rows))]
    )
    for out in outs:
        yield _finished(rows[int(out.request_id)], out, prep)


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
                p.chunks = [
                    prep.fit(p.row, joined[i : i + room], room, prep.budget(p.params))
                    for i in range(0, len(joined), room)
                ]
            except RowError as err:  # e.g. empty summaries, a reduce template that fails on this row
                yield error_record(p.base, err.error_class, f"reduce step: {err.message}", **totals[id(p)])
                continue
            next_round.append(p)
        yield from _reduce(llm, prep, finals, totals)
        pending = next_round
        if not pending:
            return
    for p in pending:
        yield error_record(p.base, PROMPT_TOO_LONG, "map_reduce did not converge", **totals[id(p)])


def _reduce(
    llm: Engine,
    prep: RowPreparer,
    finals: list[tuple[Prepared, list[int]]],
    totals: dict[int, dict[str, Any]],
) -> Iterator[dict[str, Any]]:
    if not finals:
        return
    outs = llm.generate([ids for _, ids in finals], [p.params for p, _ in finals])
    for (p, _), out in zip(finals, outs):
        rec = _finished(p, out, prep)
        t = totals[id(p)]
        for k in ("prompt_tokens", "cached_tokens", "output_tokens", "latency_s"):
            rec[k] = rec[k] + t[k]
        yield rec


def execute(
    llm: Engine, prep: RowPreparer, rows: list[Prepared], batch: int, state: Any = None
) -> Iterator[dict[str, Any]]:
    """All prepared rows of a shard, finished records in completion order (``state``: the task's
    ``run_state`` for this run, e.g. a label job's stored calibration prior)."""
    yield from prep.task.run(llm, prep, [p for p in rows if p.prompt is not None], batch, state)
    yield from map_reduce(llm, prep, [p for p in rows if p.prompt is None])

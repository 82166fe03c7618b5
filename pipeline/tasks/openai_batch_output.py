"""OpenAI Batch JSONL output: one line per input line, in input order.

A line is ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}``.
A completed request has status 200 and a ``chat.completion`` or ``text_completion`` body with
``choices`` and ``usage``; a request that could not run has status 400 and an ``{"error": {...}}``
body whose ``code`` is the pipeline's error class. The top-level ``error`` is for batch-level
failures, which never reach the file (an unfinished run writes no file at all).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any


def _stable_id(prefix: str, run_id: str, custom_id: str) -> str:
    return f"{prefix}_{hashlib.sha256(f'{prefix}:{run_id}:{custom_id}'.encode()).hexdigest()[:24]}"


def _error_body(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


def _usage(record: Mapping[str, Any]) -> dict[str, Any]:
    prompt, output = int(record.get("prompt_tokens") or 0), int(record.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
        "prompt_tokens_details": {"cached_tokens": int(record.get("cached_tokens") or 0)},
    }


def _choice(kind: str, index: int, text: str, finish_reason: str) -> dict[str, Any]:
    if kind == "chat":
        return {
            "index": index,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}


def _choices(kind: str, record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One choice per sample (``n``); a row without samples has the one in ``output``."""
    samples = record.get("samples") or [
        {"text": record.get("output"), "finish_reason": record.get("finish_reason")}
    ]
    return [
        _choice(kind, i, s.get("text") or "", s.get("finish_reason") or "stop") for i, s in enumerate(samples)
    ]


def response_line(
    request: Mapping[str, Any], record: Mapping[str, Any] | None, model: str, run_id: str, created: int
) -> dict[str, Any]:
    """The output line of one input line (``request`` is its row of the requests table)."""
    custom_id = request["custom_id"]
    request_id = _stable_id("req", run_id, custom_id)
    body: dict[str, Any]
    if request.get("request_error"):
        body, status = _error_body(request["request_error"], "unsupported_request"), 400
    elif record is None:
        raise ValueError(f"no result for custom_id {custom_id!r}")
    elif record.get("error_class"):
        body, status = _error_body(record.get("error") or "error", str(record["error_class"])), 400
    else:
        kind = request["request_kind"]
        body = {
            "id": _stable_id("chatcmpl" if kind == "chat" else "cmpl", run_id, custom_id),
            "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created,
            "model": model,
            "choices": _choices(kind, record),
            "usage": _usage(record),
        }
        status = 200
    return {
        "id": _stable_id("batch_req", run_id, custom_id),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }


def results_jsonl(
    requests: Iterable[Mapping[str, Any]],
    records: Mapping[str, Mapping[str, Any]],
    model: str,
    run_id: str,
    created: int,
) -> bytes:
    """The whole output file: every request's line, in input (line) order."""
    ordered = sorted(requests, key=lambda r: r["line"])
    lines = [
        json.dumps(response_line(r, records.get(r["custom_id"]), model, run_id, created), ensure_ascii=False)
        for r in ordered
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")

"""OpenAI Batch JSONL input (the format of the OpenAI Batch API and `vllm run-batch`).

Each line is ``{"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
"body": {...}}``. The file becomes one Parquet table the ordinary pipeline runs: chat lines carry
their messages (as JSON text, so any content shape survives), completion lines their prompt, and
the sampling fields become per-row sampling columns. A request this engine cannot honour is not
sent to it: its line gets a 400 response with the reason (see openai_batch_output.py).

A file that is not Batch JSONL at all (not JSON, no custom_id, a custom_id used twice) is refused
as a whole, naming the line, as the OpenAI Batch API does.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefixflow.pipeline.errors import InputError

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
KINDS = {CHAT_URL: "chat", COMPLETIONS_URL: "completion"}
# Body fields accepted as they are (no effect on the result, or handled elsewhere).
IGNORED = {"model", "user", "metadata", "store", "service_tier", "stream_options", "messages", "prompt"}
# Body field -> (sampling column, type): the fields the engine implements.
SAMPLING = {
    "max_tokens": ("max_tokens", int),
    "max_completion_tokens": ("max_tokens", int),
    "temperature": ("temperature", float),
    "top_p": ("top_p", float),
    "seed": ("seed", int),
    "stop": ("stop", list),
    "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float),
    "repetition_penalty": ("repetition_penalty", float),
    "n": ("n", int),
    "top_k": ("top_k", int),
    "min_p": ("min_p", float),
}
# Body fields accepted only with the value that changes nothing (the default); any other value is a 400.
NO_OP = {
    "logprobs": (False,),
    "top_logprobs": (0,),
    "tools": ([],),
    "functions": ([],),
    "tool_choice": ("none",),
    "parallel_tool_calls": (False, True),
    "response_format": ({"type": "text"},),
    "logit_bias": ({},),
    "echo": (False,),
    "best_of": (1,),
    "modalities": (["text"],),
}
# The per-row sampling columns of the requests table.
SUPPORTED_COLUMNS = (
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "n",
)

SCHEMA = pa.schema(
    [
        pa.field("custom_id", pa.string(), nullable=False),
        pa.field("line", pa.int64(), nullable=False),
        pa.field("request_kind", pa.string()),
        pa.field("messages", pa.string()),
        pa.field("prompt", pa.string()),
        pa.field("request_error", pa.string()),
        pa.field("max_tokens", pa.int64()),
        pa.field("temperature", pa.float64()),
        pa.field("top_p", pa.float64()),
        pa.field("seed", pa.int64()),
        pa.field("stop", pa.list_(pa.string())),
        pa.field("top_k", pa.int64()),
        pa.field("min_p", pa.float64()),
        pa.field("presence_penalty", pa.float64()),
        pa.field("frequency_penalty", pa.float64()),
        pa.field("repetition_penalty", pa.float64()),
        pa.field("n", pa.int64()),
    ]
)


@dataclass(frozen=True)
class BatchRequest:
    """One line: where it came from, what kind of request, and why it cannot run (or None)."""

    custom_id: str
    line: int
    kind: str
    messages: str | None
    prompt: str | None
    sampling: dict[str, Any]
    error: str | None


def looks_like_batch(head: bytes) -> bool:
    """Whether a file's first bytes are a JSON object line with ``custom_id`` (cheap sniffing)."""
    first = head.lstrip().split(b"\n", 1)[0]
    if not first.startswith(b"{"):
        return False
    try:
        return "custom_id" in json.loads(first)
    except ValueError:
        return b'"custom_id"' in first  # a long first line cut by the sniff window


def parse_batch(data: bytes, source: str) -> list[BatchRequest]:
    """All requests of a Batch JSONL file, in line order. Raises InputError for a malformed file."""
    requests: list[BatchRequest] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{source} line {number}"
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise InputError(f"{where} is not JSON ({exc}); each line must be one request object") from exc
        if (
            isinstance(obj, dict)
            and isinstance(obj.get("custom_id"), str)
            and obj["custom_id"]
            and not obj["custom_id"].strip()
        ):
            raise InputError(
                f"{where}: custom_id {obj['custom_id']!r} is only whitespace; a custom_id must name its "
                "request (its result is matched by it)"
            )
        if not isinstance(obj, dict) or not isinstance(obj.get("custom_id"), str) or not obj["custom_id"]:
            if not requests:  # the first line already: most likely not meant as a Batch file at all
                raise InputError(
                    f"{source} is neither a Parquet file nor an OpenAI Batch file: line {number} has no "
                    "custom_id. prefixflow reads Parquet (convert JSON lines with "
                    "polars.read_ndjson(...).write_parquet(...)) or OpenAI Batch JSONL"
                )
            raise InputError(
                f"{where} has no custom_id (a non-empty string); OpenAI Batch lines look like "
                '{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}'
            )
        custom_id = obj["custom_id"]
        if custom_id in seen:
            raise InputError(
                f"{where}: custom_id {custom_id!r} is already used on line {seen[custom_id]}; "
                "custom_ids must be unique within a batch"
            )
        seen[custom_id] = number
        requests.append(_request(obj, custom_id, number))
    if not requests:
        raise InputError(f"{source} holds no requests (empty file)")
    return requests


def _request(obj: dict[str, Any], custom_id: str, line: int) -> BatchRequest:
    url = obj.get("url")
    kind = KINDS.get(url) if isinstance(url, str) else None
    body = obj.get("body")

    def refused(why: str) -> BatchRequest:
        return BatchRequest(custom_id, line, kind or "unsupported", None, None, {}, why)

    if kind is None:
        return refused(f"url {url!r} is not supported; use {CHAT_URL} or {COMPLETIONS_URL}")
    if obj.get("method", "POST") != "POST":
        return refused(f"method {obj.get('method')!r}: only POST is supported")
    if not isinstance(body, dict):
        return refused("body must be a JSON object")
    try:
        sampling = _sampling(body)
        if kind == "completion":
            return BatchRequest(custom_id, line, kind, None, _prompt(body.get("prompt")), sampling, None)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("body.messages must be a non-empty list of {role, content} messages")
        return BatchRequest(
            custom_id, line, kind, json.dumps(messages, ensure_ascii=False), None, sampling, None
        )
    except ValueError as exc:
        return refused(str(exc))


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ValueError("body.prompt must be one string (one prompt per line)")
    return prompt


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    """Per-row sampling values from the body; a field the engine cannot honour is a ValueError."""
    if body.get("stream"):
        raise ValueError("body.stream: streaming makes no sense in a batch; leave it out")
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key in IGNORED or key == "stream" or value is None:
            continue
        if (
            key in NO_OP
            and key not in SAMPLING
            and any(value == v and type(value) is type(v) for v in NO_OP[key])
        ):
            continue  # the default value: nothing to honour
        if key not in SAMPLING:
            raise ValueError(f"body.{key} is not supported by this engine")
        column, kind = SAMPLING[key]
        out[column] = _typed(key, value, kind)
    return out


def _typed(key: str, value: Any, kind: type) -> Any:
    if kind is list:
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ValueError(f"body.{key} must be a string or a list of strings")
        return stops
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"body.{key} must be a number, got {value!r}")
    if kind is int and float(value) != int(value):
        raise ValueError(f"body.{key} must be a whole number, got {value!r}")
    return kind(value)


def requests_table(requests: list[BatchRequest]) -> bytes:
    """The requests as one Parquet file (row groups of 1,000 lines, so shards can split it)."""
    rows = [
        {
            "custom_id": r.custom_id,
            "line": r.line,
            "request_kind": r.kind,
            "messages": r.messages,
            "prompt": r.prompt,
            "request_error": r.error,
            **r.sampling,
        }
        for r in requests
    ]
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), buf, row_group_size=1000, compression="zstd")
    return buf.getvalue()


# The job of a requests table: the prompt side each line brings (chat lines' messages through the chat template,
# completion prompts as given, the body's sampling per row), under the openai_batch task (openai_batch_task.py).
BATCH_FIELDS: dict[str, Any] = {
    "task": "openai_batch",
    "id_column": "custom_id",
    "messages_column": "messages",
    "prompt_column": "prompt",
    "template": None,
    "chat": "off",
    "system_prompt": None,
    "keep_columns": ["request_kind"],
    "sampling_columns": {c: c for c in SUPPORTED_COLUMNS},
}
# what a job written for a Batch file may say for ``task`` (generate: what Batch jobs ran as before the task)
BATCH_TASK_NAMES = (None, "generate", "openai_batch")


def batch_job(base: dict[str, Any]) -> dict[str, Any]:
    """The job a Batch file runs as: the user's job (engine, sharding, default sampling) with the
    prompt side fixed by the file (BATCH_FIELDS)."""
    clash = sorted(
        k
        for k in BATCH_FIELDS
        if k in base and base[k] not in ((BATCH_TASK_NAMES) if k == "task" else (None, BATCH_FIELDS[k]))
    )
    if clash:
        raise InputError(
            f"an OpenAI Batch file sets its own {', '.join(clash)}; leave them out of the job config"
        )
    return {**base, **BATCH_FIELDS}


def describe_requests(requests: list[BatchRequest]) -> dict[str, Any]:
    """What `prefixflow plan` shows for a Batch file: counts per kind, and the requests that cannot run."""
    kinds: dict[str, int] = {}
    for r in requests:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    refused = [{"custom_id": r.custom_id, "line": r.line, "error": r.error} for r in requests if r.error]
    return {"format": "openai-batch", "requests": len(requests), "kinds": kinds, "refused": refused}

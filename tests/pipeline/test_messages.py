"""A `messages` column of list<struct<role, content>> is the conversation itself (`messages_column`)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from prefixflow.pipeline import JobConfigError, load_job
from prefixflow.pipeline.errors import BAD_TYPE, EMPTY_PROMPT, NULL_PROMPT, RowError
from prefixflow.pipeline.prompts.render import conversation
from prefixflow.pipeline.run.local_run import run_local
from tests.pipeline.support import ENGINE, write_parquet

MESSAGE = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])
SCHEMA = pa.schema(
    [pa.field("id", pa.string()), pa.field("messages", pa.list_(MESSAGE)), pa.field("prompt", pa.string())]
)


def _conv(*turns: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": r, "content": c} for r, c in turns]


ROWS = [
    {
        "id": "two-turns",
        "messages": _conv(("user", "Name a river."), ("assistant", "Nile."), ("user", "Another?")),
        "prompt": None,
    },
    {"id": "own-system", "messages": _conv(("system", "Be brief."), ("user", "Hi")), "prompt": None},
    {"id": "bad-role", "messages": _conv(("wizard", "abracadabra")), "prompt": None},
    {"id": "empty", "messages": [], "prompt": None},
    {"id": "null", "messages": None, "prompt": None},
    {"id": "fallback", "messages": None, "prompt": "plain completion prompt"},
]


def test_conversation_cells_are_checked_with_messages_that_say_what_is_wrong() -> None:
    assert conversation('[{"role": "user", "content": "hi"}]', "c") == _conv(("user", "hi"))  # JSON text too
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert conversation(parts, "c") == _conv(("user", "a\nb"))
    cases = [
        (None, NULL_PROMPT, "is null"),
        ([], EMPTY_PROMPT, "no messages"),
        ("not json", BAD_TYPE, "not a JSON"),
        (_conv(("robot", "x")), BAD_TYPE, r"c\[0\]\.role is 'robot'"),
        (42, BAD_TYPE, "got int"),
        (
            [{"role": "user", "content": [{"type": "image_url"}]}],
            BAD_TYPE,
            r"c\[0\]\.content\[0\] is not a text part",
        ),
        (_conv(("user", "  ")), EMPTY_PROMPT, "every message is empty"),
    ]
    for value, error_class, message in cases:
        with pytest.raises(RowError, match=message) as info:
            conversation(value, "c")
        assert info.value.error_class == error_class


def test_messages_column_config_rules() -> None:
    with pytest.raises(JobConfigError, match="messages_column or template"):
        load_job("in", "", "tiny", {"messages_column": "m", "template": "{{ x }}"})
    with pytest.raises(JobConfigError, match="messages_column: applies to generate and label"):
        load_job("in", "", "tiny", {"task": "summarize", "messages_column": "m"})
    spec = load_job("in", "", "tiny", {"messages_column": "m"})
    assert spec.config.prompt_column is None and spec.input_columns() == ["m"]


def test_a_messages_column_runs_as_the_conversation(tmp_path: Path, tiny_llm) -> None:
    write_parquet(tmp_path / "in" / "chats.parquet", ROWS, schema=SCHEMA)
    cfg = {
        "messages_column": "messages",
        "prompt_column": "prompt",
        "id_column": "id",
        "system_prompt": "Job system.",
        "sampling": {"max_tokens": 4},
        "engine": dict(ENGINE),
    }
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    assert not failures and summary.rows == len(ROWS)
    df = {r["id"]: r for r in pl.read_parquet(summary.data_glob).to_dicts()}
    assert df["bad-role"]["error_class"] == BAD_TYPE and "'wizard'" in df["bad-role"]["error"]
    assert df["empty"]["error_class"] == EMPTY_PROMPT and df["null"]["error_class"] == NULL_PROMPT

    def expected(messages: list[dict[str, str]]):
        prompt = tiny_llm.apply_chat_template(messages)
        ids = tiny_llm.tokenizer.encode(prompt, add_special_tokens=False)
        return len(ids), tiny_llm.generate([ids], spec_params(spec))[0].text

    # the job's system prompt leads a conversation without one; a conversation's own system prompt wins
    two = expected([{"role": "system", "content": "Job system."}, *ROWS[0]["messages"]])
    own = expected(ROWS[1]["messages"])
    for row_id, (n_prompt, text) in (("two-turns", two), ("own-system", own)):
        assert df[row_id]["error"] is None and df[row_id]["prompt_tokens"] == n_prompt
        assert df[row_id]["output"] == text
    assert df["fallback"]["error"] is None and df["fallback"]["output"] is not None


def spec_params(spec):
    return spec.config.sampling.params()


def test_n_samples_and_penalties_in_a_parquet_job(tmp_path: Path, tiny_llm) -> None:
    """`sampling.n` writes every sample to `samples` (the first is `output`); penalties reach the engine."""
    from prefixflow.engine import SamplingParams

    write_parquet(tmp_path / "in" / "p.parquet", [{"id": "a", "prompt": "one"}, {"id": "b", "prompt": "two"}])
    sampling = {"max_tokens": 4, "n": 3, "temperature": 1.0, "seed": 3, "repetition_penalty": 1.2}
    cfg = {"id_column": "id", "sampling": sampling, "chat": "off", "engine": dict(ENGINE)}
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    summary, _ = run_local(spec, llm=tiny_llm, progress=False)
    rows = {r["id"]: r for r in pl.read_parquet(summary.data_glob).to_dicts()}
    expect = tiny_llm.generate(["one"], SamplingParams(**sampling))[0]
    assert [s["text"] for s in rows["a"]["samples"]] == [s.text for s in expect.outputs]
    assert (
        rows["a"]["output"] == expect.outputs[0].text
        and rows["a"]["output_tokens"] == expect.num_output_tokens
    )
    with pytest.raises(JobConfigError, match="generate and openai_batch jobs only"):
        load_job(
            "in",
            "",
            "tiny",
            {"task": "label", "template": "{{ x }}", "label": {"labels": ["a", "b"]}, "sampling": {"n": 2}},
        )

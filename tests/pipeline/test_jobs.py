"""Summarize and label jobs end to end on the tiny model: long-document policies, labels, kept columns,
resume inside a shard, and a corrupt file that fails only its own shard."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from prefixflow.pipeline import (
    ShardError,
    load_job,
    open_run,
    plan_shards,
    prepare_run,
    run_shard,
    status,
)
from prefixflow.pipeline.local_run import run_local
from prefixflow.pipeline.tasks.label.task import parse_label
from tests.pipeline.support import ENGINE, docs, job, write_dataset, write_parquet

LONG = " ".join(f"w{i}" for i in range(300))


def _run(tmp_path: Path, llm, cfg: dict, name: str = "out"):
    spec = load_job(str(tmp_path / "in"), str(tmp_path / name), "tiny", cfg)
    summary, failures = run_local(spec, llm=llm, progress=False)
    assert failures == []
    return spec, summary, pl.read_parquet(summary.data_glob).sort("row_index")


@pytest.mark.parametrize("template", ["Summarize: {{ document }}", "Summarize: {{ text }}"])
@pytest.mark.parametrize("policy", ["truncate-head", "truncate-tail", "truncate-both", "map_reduce", "error"])
def test_long_document_policies(tmp_path: Path, tiny_llm, policy: str, template: str) -> None:
    write_parquet(
        tmp_path / "in" / "d.parquet", [{"id": "short", "text": "a short one"}, {"id": "long", "text": LONG}]
    )
    kind, _, side = policy.partition("-")
    cfg = job(
        "summarize",
        template=template,
        summarize={"long_document": kind, "truncate_side": side or "head", "chunk_tokens": 60},
    )
    _, summary, df = _run(tmp_path, tiny_llm, cfg)
    long = df.filter(pl.col("id") == "long").row(0, named=True)
    short = df.filter(pl.col("id") == "short").row(0, named=True)
    assert (
        long["truncated"] is (kind == "truncate") and short["truncated"] is False
    )  # says when input was cut
    budget = ENGINE["max_model_len"] - 4
    if kind == "error":
        assert long["error_class"] == "prompt_too_long"
        return
    assert long["error"] is None and long["output_tokens"] >= 1
    if kind == "truncate":
        assert long["prompt_tokens"] <= budget
    else:  # several map calls plus a reduce call: more prompt tokens than one request can hold
        assert long["prompt_tokens"] > budget and long["output_tokens"] > 4
    assert summary.error_rows == 0


def test_label_scores_are_normalized_probabilities(tmp_path: Path, tiny_llm) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=6)
    _, summary, df = _run(tmp_path, tiny_llm, job("label", keep_columns=["title"]))
    assert df.height == 6 and summary.error_rows == 0
    for row in df.to_dicts():
        probs = row["label_probs"]
        assert set(probs) == {"positive", "negative", "neutral"}
        assert math.isclose(sum(probs.values()), 1.0, rel_tol=1e-9)
        assert row["label"] == max(probs, key=probs.get)
        assert row["title"].startswith("title ")


def test_label_rows_report_their_own_prompt_tokens(tmp_path: Path, tiny_llm) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=6)
    _, summary, df = _run(tmp_path, tiny_llm, job("label", chat="off", keep_columns=["text"]))
    for row in df.to_dicts():
        prompt = tiny_llm.tokenizer.encode(f"Sentiment of: {row['text']}", add_special_tokens=True)
        assert row["prompt_tokens"] == len(prompt)  # once, not prompt + choice once per label
        assert 0 <= row["cached_tokens"] <= row["prompt_tokens"] and row["output_tokens"] == 0
    assert summary.prompt_tokens == df["prompt_tokens"].sum() and 0 <= summary.prefix_hit_rate <= 1
    assert (df["latency_s"] > 0).all()  # the wall time of the row's scoring batch


def test_label_generate_mode_parses_or_reports(tmp_path: Path, tiny_llm) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=4)
    _, _, df = _run(tmp_path, tiny_llm, job("label", label={"mode": "generate"}))
    for row in df.to_dicts():  # random weights: the text rarely names a label, so expect parse errors
        if row["error_class"] is None:
            assert row["label"] == parse_label(row["output"], ("positive", "negative", "neutral"))
        else:
            assert row["error_class"] == "label_parse_error" and row["output"] is not None


def test_parse_label() -> None:
    labels = ("positive", "negative", "neutral", "very positive")
    assert parse_label("Answer: Negative.", labels) == "negative"
    assert parse_label("very positive, not negative", labels) == "very positive"
    assert parse_label("nonpositive", labels) is None


def test_keep_columns_dictionary_and_large_strings(tmp_path: Path, tiny_llm) -> None:
    rows = docs(5)
    schema = pa.schema(
        [("id", pa.string()), ("title", pa.dictionary(pa.int32(), pa.string())), ("text", pa.large_string())]
    )
    write_parquet(tmp_path / "in" / "d.parquet", rows, schema=schema)
    _, _, df = _run(tmp_path, tiny_llm, job("generate", keep_columns=["title", "text"]))
    assert df["title"].to_list() == [r["title"] for r in rows]
    assert df["id"].to_list() == [r["id"] for r in rows]


def test_chat_template_and_system_prompt_change_the_prompt(tmp_path: Path, tiny_llm) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=2)
    _, _, plain = _run(tmp_path, tiny_llm, job("generate", chat="off"), "plain")
    _, _, chat = _run(tmp_path, tiny_llm, job("generate", chat="on", system_prompt="Be brief."), "chat")
    assert (chat["prompt_tokens"] > plain["prompt_tokens"] + 3).all()


class _Crash(Exception):
    pass


class _CrashAfter:
    """A progress sink that aborts the shard after n rows: a crash between flushes."""

    def __init__(self, n: int) -> None:
        self.n = n

    def advance(self, rows: int, *counts: int) -> None:
        self.n -= rows
        if self.n < 0:
            raise _Crash


@pytest.mark.parametrize("publish", ["direct", "copy"])
def test_resume_inside_a_shard_keeps_flushed_rows(tmp_path: Path, tiny_llm, publish: str) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=10, row_group_size=10)
    cfg = job("generate", output={"shard_rows": 10, "flush_rows": 3, "publish": publish})
    _, _, clean = _run(tmp_path, tiny_llm, cfg, "clean")
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    run = prepare_run(spec)
    (shard,) = plan_shards(spec)
    with pytest.raises(_Crash):
        run_shard(run, shard, tiny_llm, progress=_CrashAfter(7))
    if publish == "copy":
        assert not (tmp_path / "out" / "data").exists()  # nothing visible before the commit
    else:  # the 6 rows of the two full flushes are in data/ already, uncommitted, each once
        flushed = pl.read_parquet(str(tmp_path / "out" / "data" / "**" / "*.parquet"))
        assert flushed.height == 6 and flushed["id"].n_unique() == 6
    mid, _ = status(str(tmp_path / "out"))
    assert mid.shards_in_progress == [shard.shard_id] and mid.shards_committed == 0 and not mid.complete
    second = open_run(spec)  # a new process resumes from one listing
    result = run_shard(second, shard, tiny_llm)
    assert result.resumed_rows == 6 and result.rows == 10 and not result.skipped
    again = run_shard(second, shard, tiny_llm)  # its commit updated the Run in place
    assert again.skipped and again.rows == 10
    # the first Run is stale (it never saw that commit): it generates again, loses the marker race and
    # adopts the winner's marker, so data/ still holds every row once
    late = run_shard(run, shard, tiny_llm)
    assert late.rows == 10 and run.marker(shard.shard_id) == second.marker(shard.shard_id)
    assert again.skipped and again.rows == 10
    df = pl.read_parquet(str(tmp_path / "out" / "data" / "**" / "*.parquet")).sort("row_index")
    assert df["id"].to_list() == clean["id"].to_list()
    assert df["output"].to_list() == clean["output"].to_list()


def test_corrupt_files_fail_their_shards_only(tmp_path: Path, tiny_llm) -> None:
    write_dataset(tmp_path / "in", files=2, rows_per_file=4)
    (tmp_path / "in" / "broken.parquet").write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")  # no valid footer
    pages = write_parquet(tmp_path / "in" / "pages.parquet", docs(8), row_group_size=8)
    raw = bytearray(pages.read_bytes())
    raw[8:120] = bytes((b * 7 + 13) % 256 for b in raw[8:120])  # footer intact, first page header not
    pages.write_bytes(bytes(raw))
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("generate"))
    summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    assert all(isinstance(f, ShardError) for f in failures)
    messages = sorted(str(f) for f in failures)
    assert len(messages) == 2
    assert "broken.parquet" in messages[0] and "cannot read Parquet file" in messages[0]
    assert "pages.parquet" in messages[1] and "cannot read input" in messages[1]
    # part-0 and part-1 (4 rows each) share one packed shard; pages.parquet (8) is its own
    assert summary.rows == 8 and summary.shards_committed == 1 and summary.shards_total == 3
    assert not summary.complete and len(summary.shards_pending) == 2


def test_map_reduce_reduce_step_failure_is_a_row_error(tmp_path: Path, tiny_llm) -> None:
    write_parquet(
        tmp_path / "in" / "d.parquet",
        [{"id": "short", "text": "a short one", "n": 0}, {"id": "long", "text": LONG, "n": 0}],
    )
    cfg = job(
        "summarize",
        summarize={"long_document": "map_reduce", "reduce_template": "{{ summaries }} {{ 1 // n }}"},
    )
    _, summary, df = _run(tmp_path, tiny_llm, cfg)
    rows = {r["id"]: r for r in df.to_dicts()}
    assert rows["short"]["error"] is None  # the reduce template is only used for long documents
    assert rows["long"]["error_class"] == "template_error" and rows["long"]["error"].startswith("reduce step")
    assert rows["long"]["prompt_tokens"] > 0  # the map calls' tokens are still counted

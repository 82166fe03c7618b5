"""Job config validation: every message names the bad key and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixflow.pipeline import JobConfigError, load_job

REPO = Path(__file__).resolve().parents[3]


def _err(job, **overrides) -> str:
    with pytest.raises(JobConfigError) as info:
        load_job("in/", "out/", "tiny", job, **overrides)
    return str(info.value)


@pytest.mark.parametrize("name", ["summarize.yaml", "label.yaml"])
def test_shipped_job_configs_validate(name: str) -> None:
    spec = load_job("in/", "out/", "tiny", str(REPO / "configs" / "jobs" / name))
    assert spec.config.task == name.split(".")[0]


@pytest.mark.parametrize(
    ("job", "must_contain"),
    [
        ({"smpling": {}}, ["smpling", "did you mean 'sampling'", "allowed keys"]),
        ({"task": "sumarize"}, ["task", "'sumarize'", "generate, summarize, label"]),
        (
            {"task": "summarize", "summarize": {"long_document": "trunc"}},
            ["summarize.long_document", "error, truncate, map_reduce"],
        ),
        (
            {"task": "summarize", "summarize": {"truncate_side": "middle"}},
            ["summarize.truncate_side", "head, tail, both"],
        ),
        ({"label": {"mode": "vote"}, "prompt_column": "p"}, ["label.mode", "score, generate"]),
        ({"task": "label", "template": "x", "label": {"labels": ["yes"]}}, ["label.labels", "at least two"]),
        ({"task": "label", "template": "x", "label": {"labels": ["a", "a"]}}, ["label.labels", "unique"]),
        ({"task": "label", "label": {"labels": ["a", "b"]}}, ["prompt_column", "template"]),
        ({"chat": "sometimes"}, ["chat", "auto, on, off"]),
        ({"output": {"flush_rows": 0}}, ["output.flush_rows", "positive integer"]),
        ({"output": {"shard_row": 5}}, ["output.shard_row", "did you mean 'shard_rows'"]),
        ({"engine": {"max_num_seq": 4}}, ["engine.max_num_seq", "max_num_seqs"]),
        ({"engine": {"dtype": "int3"}}, ["engine", "dtype", "float32"]),
        ({"sampling": {"temperature": -1}}, ["sampling", "temperature"]),
        ({"sampling_columns": {"max_token": "m"}}, ["sampling_columns.max_token", "max_tokens"]),
        ({"sampling": {"logit_bias": {"5": float("inf")}}}, ["sampling", "logit_bias", "finite"]),
        ({"sampling": {"logit_bias": {"x5": 1.0}}}, ["sampling", "logit_bias", "token ids", "int()"]),
        ({"sampling_columns": {"logit_bias": "b"}}, ["sampling_columns.logit_bias", "whole job"]),
        ({"template": "{{ text"}, ["template", "Jinja2"]),
        ({"template": "x", "prompt_column": "p"}, ["template", "not both"]),
        ({"keep_columns": "title"}, ["keep_columns", "list"]),
        ({"keep_columns": ["title", "id"]}, ["keep_columns", "['id']", "overwrite output columns"]),
    ],
)
def test_bad_config_messages(job: dict, must_contain: list[str]) -> None:
    message = _err(job)
    for part in must_contain:
        assert part in message, message


def test_yaml_file_errors(tmp_path: Path) -> None:
    assert "not found" in _err(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: [unclosed\n")
    assert "not valid YAML" in _err(str(bad))
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    assert "mapping" in _err(str(listy))
    typo = tmp_path / "typo.yaml"
    typo.write_text("task: summarize\nsummarize:\n  long_documnet: error\n")
    assert "summarize.long_documnet" in _err(str(typo))


def test_overrides_and_unknown_override() -> None:
    spec = load_job(
        "in/", "out/", "tiny", {"task": "summarize"}, max_tokens=7, shard_rows=3, endpoint_url="http://x"
    )
    assert spec.config.sampling.max_tokens == 7
    assert spec.config.output.shard_rows == 3
    assert spec.config.storage.endpoint_url == "http://x"
    assert "unknown override 'max_tokenz'" in _err({}, max_tokenz=3)


def test_missing_input_or_model_fails_fast() -> None:
    with pytest.raises(JobConfigError, match="input"):
        load_job("", "out/", "tiny")
    with pytest.raises(JobConfigError, match="model"):
        load_job("in/", "out/", "")


def test_fingerprint_tracks_outputs_not_flush_timing(tmp_path: Path) -> None:
    a = load_job("in/", "out/", "tiny", {"task": "summarize"})
    assert (
        a.fingerprint_hash()
        == load_job("in/", "out/", "tiny", {"task": "summarize"}, flush_rows=9).fingerprint_hash()
    )
    assert (
        a.fingerprint_hash()
        != load_job("in/", "out/", "tiny", {"task": "summarize"}, max_tokens=9).fingerprint_hash()
    )
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    (other / "model.safetensors").write_bytes(b"weights")
    assert (
        a.fingerprint_hash() != load_job("in/", "out/", str(other), {"task": "summarize"}).fingerprint_hash()
    )
    assert (
        a.fingerprint_hash()
        != load_job("in/", "out/", "tiny", {"task": "summarize"}, shard_rows=5).fingerprint_hash()
    )


def test_job_spec_pickles_for_other_processes() -> None:
    import pickle

    spec = load_job(
        "in/", "out/", "tiny", str(REPO / "configs" / "jobs" / "label.yaml"), endpoint_url="http://x"
    )
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec and again.fingerprint_hash() == spec.fingerprint_hash()


def test_logit_bias_string_token_ids_are_read_as_ids() -> None:
    """JSON and the OpenAI API write a logit bias's token ids as strings."""
    spec = load_job(
        "in", "out", "tiny", {"prompt_column": "p", "sampling": {"logit_bias": {"50": -100, 7: 2.5}}}
    )
    assert spec.config.sampling.logit_bias == {50: -100, 7: 2.5}

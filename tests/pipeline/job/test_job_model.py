"""The typed job model (pipeline/job/config.py): frozen, one section per part of the job, the engine's
SamplingParams field by field, and the same fingerprint as before for an unchanged job."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path
from typing import Any

import pydantic
import pytest

from prefixflow.pipeline import JobConfigError, load_job
from prefixflow.pipeline.job.config import SamplingSection, StructuredSection
from prefixflow.pipeline.job.spec import parse_job_config

# Captured with the dataclass job config this model replaced (fingerprint version 2): each job's
# fingerprint "job" part and its run-record "job" (what `status` re-parses). A run started before the
# change must resume after it, so both must come out byte for byte the same.
GOLDEN = json.loads((Path(__file__).parent / "data" / "fingerprint_v2_jobs.json").read_text())
# record fields added since the capture, outside the fingerprint, with the value an old record parses to
ADDED_SINCE = {("output", "publish"): "direct"}


def _without_added(record: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(record, default=str))
    for (section, key), default in ADDED_SINCE.items():
        assert out[section].pop(key) == default
    return out


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_an_unchanged_job_keeps_its_fingerprint_and_record(name: str) -> None:
    case = GOLDEN[name]
    spec = load_job("in/", "out/", "tiny", case["job"], **case["overrides"])
    job = json.loads(json.dumps(spec.fingerprint(), default=str))["job"]
    assert json.dumps(job, sort_keys=True) == json.dumps(case["fingerprint_job"], sort_keys=True)
    record = spec.config.as_record()
    record["storage"] = {"endpoint_url": spec.config.storage.endpoint_url, "options": {}}
    assert json.dumps(_without_added(record), sort_keys=True) == json.dumps(
        case["record_job"], sort_keys=True
    )
    again = parse_job_config(case["record_job"])  # `status` rebuilds the job from the run record
    assert json.dumps(_without_added(again.as_record()), sort_keys=True) == json.dumps(
        case["record_job"], sort_keys=True
    )


def test_the_job_is_frozen_and_pickles() -> None:
    spec = load_job(
        "in/", "out/", "tiny", {"task": "label", "template": "{{ t }}", "label": {"labels": ["a", "b"]}}
    )
    with pytest.raises(pydantic.ValidationError):
        spec.config.label.mode = "generate"  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        spec.config.task = "generate"  # type: ignore[misc]
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec and again.config.label.labels == ("a", "b")


def test_sampling_section_maps_one_to_one_onto_sampling_params() -> None:
    from prefixflow.engine import SamplingParams, StructuredOutputs

    params = {f.name: f for f in dataclasses.fields(SamplingParams)}
    assert set(SamplingSection.model_fields) == set(params) - {"prompt_logprobs"}  # no column holds those
    for name, field in SamplingSection.model_fields.items():
        if name != "structured":
            assert field.default == params[name].default or (
                field.default == () and params[name].default_factory() == ()
            )
    assert set(StructuredSection.model_fields) == {f.name for f in dataclasses.fields(StructuredOutputs)}
    section = parse_job_config(
        {"sampling": {"temperature": 1, "stop": ["x"], "structured": {"choice": ["a", "b"]}}}
    ).sampling
    built = section.params(section.structured.outputs())
    assert built == SamplingParams(
        temperature=1, stop=("x",), structured=StructuredOutputs(choice=("a", "b"))
    )
    assert section.given() == {"temperature": 1, "stop": ("x",), "structured": {"choice": ("a", "b")}}


@pytest.mark.parametrize(
    ("job", "must_contain"),
    [
        ({"sampling": {"tempreature": 1}}, ["sampling.tempreature", "did you mean 'temperature'"]),
        ({"sampling": {"top_p": 0}}, ["job config: sampling: top_p must be in (0, 1]"]),
        ({"sampling": {"structured": {"regx": "a"}}}, ["sampling.structured.regx", "did you mean 'regex'"]),
        ({"sampling": {"structured": "a+"}}, ["sampling.structured", "expected a mapping"]),
        ({"sampling": [1]}, ["sampling", "expected a mapping, got list"]),
        ({"label": ["a"]}, ["job config: label: expected a mapping, got list"]),
        ({"label": {"case_variants": "yes"}}, ["label.case_variants", "true or false"]),
        ({"label": {"content_free": []}}, ["label.content_free", "non-empty list"]),
        ({"template_limits": {"seconds": True}}, ["template_limits.seconds", "positive number of seconds"]),
        ({"storage": {"options": "anon"}}, ["storage.options", "mapping of fsspec options"]),
        ({"sampling_columns": {"seed": ""}}, ["sampling_columns.seed", "non-empty string"]),
        ({"sampling_columns": {"structured": "c"}}, ["sampling_columns.structured", "whole job"]),
        ({"engine": {"seed": "abc"}}, ["engine.seed", "'abc' is not an integer"]),
        ({"summarize": {"chunk_tokens": 0}}, ["summarize.chunk_tokens", "positive integer"]),
        ({"schema": {"type": "object"}}, ["schema", "applies to extract jobs only", "task: generate"]),
        ({"task": "summarize", "sampling": {"n": 2}}, ["sampling.n", "generate and openai_batch jobs only"]),
        ({"task": "extract", "template": "x"}, ["schema", "needs a JSON schema"]),
        ({"messages_column": "m", "template": "x"}, ["template", "messages_column or template"]),
        (
            {"task": "summarize", "messages_column": "m"},
            ["messages_column", "summarize reads a document column"],
        ),
    ],
)
def test_messages_name_the_key_and_the_fix(job: dict[str, Any], must_contain: list[str]) -> None:
    with pytest.raises(JobConfigError) as info:
        parse_job_config(job)
    for part in must_contain:
        assert part in str(info.value), str(info.value)


def test_empty_sections_in_yaml_are_the_defaults() -> None:
    cfg = parse_job_config({"task": "summarize", "sampling": None, "summarize": None, "engine": None})
    assert cfg.sampling == SamplingSection() and cfg.summarize.long_document == "truncate"
    assert parse_job_config({"chat": True}).chat == "on" and parse_job_config({"chat": False}).chat == "off"

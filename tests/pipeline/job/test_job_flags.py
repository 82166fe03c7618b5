"""The job flags, load_job overrides and flow job parameters are one list (pipeline/job/flags.py)."""

from __future__ import annotations

import inspect
from typing import Any

from prefixflow.pipeline.cli import build_parser
from prefixflow.pipeline.job.flags import DEFAULT_MODEL, JOB_OPTION_NAMES, overrides_from_args


def test_run_flags_become_load_job_overrides() -> None:
    args = build_parser().parse_args(
        [
            "run",
            "--input",
            "in",
            "--output",
            "out",
            "--max-tokens",
            "5",
            "--engine",
            "max_num_seqs=8",
            "--engine",
            "seed=3",
            "--storage-option",
            "anon=true",
            "--endpoint-url",
            "http://s3",
            "--flush-seconds",
            "2",
            "--quantization",
            "int4",
        ]
    )
    assert args.model == DEFAULT_MODEL
    assert overrides_from_args(args) == {
        "max_tokens": 5,
        "quantization": "int4",
        "flush_seconds": 2.0,
        "engine": {"max_num_seqs": 8, "seed": 3},
        "endpoint_url": "http://s3",
        "storage_options": {"anon": True},
    }


def test_serve_takes_the_same_job_flags_and_the_flow_has_each_parameter() -> None:
    from prefixflow.flows.cli import build_parser as serve_parser
    from prefixflow.flows.cli import flow_parameters
    from prefixflow.flows.flow import batch_inference

    argv = [
        "--input",
        "in",
        "--output",
        "out",
        "--max-tokens",
        "5",
        "--engine",
        "seed=3",
        "--id-column",
        "id",
    ]
    run_args = build_parser().parse_args(["run", *argv])
    serve_args = serve_parser().parse_args(argv)
    params = flow_parameters(serve_args)
    assert {k: params[k] for k in overrides_from_args(run_args)} == overrides_from_args(run_args)
    signature = inspect.signature(batch_inference.fn).parameters
    assert set(JOB_OPTION_NAMES) <= set(signature)
    assert signature["model"].default == DEFAULT_MODEL
    assert set(params) <= set(signature)


def test_options_come_from_the_job_model_and_the_flow_parameters_are_generated_from_them() -> None:
    import typing

    from prefixflow.flows.credentials import SAFE_OPTIONS_SCHEMA
    from prefixflow.flows.flow import batch_inference
    from prefixflow.pipeline.job.config import JobConfig, Option
    from prefixflow.pipeline.job.flags import (
        API_OPTIONS,
        JOB_OPTIONS,
        SECTION_OPTIONS,
        SHORTCUTS,
        STORAGE_OPTIONS,
        comma_list,
    )

    by_name = {o.name: o for o in (*JOB_OPTIONS, *STORAGE_OPTIONS)}
    assert by_name["max_tokens"].parse is int and by_name["temperature"].parse is float  # SamplingSection's
    assert by_name["shard_rows"].parse is int and by_name["labels"].parse is comma_list
    assert SHORTCUTS["max_tokens"] == ("sampling", "max_tokens") and SHORTCUTS["label_mode"] == (
        "label",
        "mode",
    )
    assert by_name["storage_options"].flag == "--storage-option" and by_name["engine"].repeatable
    assert {o.name for o in API_OPTIONS} == {
        "document_column",
        "long_document",
        "truncate_side",
        "label_mode",
    }
    # every option but the engine's own section keys is a marked field of the job model
    marked = JobConfig.model_fields["sampling"].annotation.model_fields["max_tokens"].metadata  # type: ignore[union-attr]
    assert [m.help for m in marked if isinstance(m, Option)] == [by_name["max_tokens"].help]
    assert all(o.path[0] in ("engine", "speculative") for o in SECTION_OPTIONS)

    # the flow's signature is generated: one keyword-only parameter per option, typed, in the option order
    signature = inspect.signature(batch_inference.fn).parameters
    hints = typing.get_type_hints(batch_inference.fn, include_extras=False)
    names = [o.name for o in (*JOB_OPTIONS, *STORAGE_OPTIONS)]
    assert [n for n in signature if n in by_name] == names
    assert list(signature)[: len(names) + 4] == ["input", "output", "model", "job", *names]
    expected = {"labels": list[str], "num_speculative_tokens": int | str}
    expected |= {"engine": dict[str, Any], "storage_options": dict[str, Any]}
    for name, option in by_name.items():
        assert signature[name].kind is inspect.Parameter.KEYWORD_ONLY and signature[name].default is None
        assert hints[name] == expected.get(name, option.parse) | None, name

    # ... and Prefect's parameter schema (what the UI shows and the API validates) has each, described
    schema = batch_inference.parameters.model_dump()["properties"]
    assert schema["max_tokens"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]
    assert schema["labels"]["anyOf"][0] == {"items": {"type": "string"}, "type": "array"}
    assert schema["temperature"]["description"].startswith(by_name["temperature"].help)
    assert schema["storage_options"]["anyOf"] == SAFE_OPTIONS_SCHEMA["anyOf"]  # the credentials guard kept
    assert [schema[n]["position"] for n in names] == list(range(4, 4 + len(names)))


def test_a_misspelt_flow_parameter_is_refused_by_name() -> None:
    import pytest
    from prefect.exceptions import SignatureMismatchError

    from prefixflow.flows.flow import batch_inference

    with pytest.raises(SignatureMismatchError, match="max_tokenz"):
        batch_inference.validate_parameters({"input": "in", "output": "out", "max_tokenz": 5})
    assert (
        batch_inference.validate_parameters({"input": "in", "output": "out", "max_tokens": "5"})["max_tokens"]
        == 5
    )

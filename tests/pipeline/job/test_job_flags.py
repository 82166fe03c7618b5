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


def test_option_types_come_from_the_job_model_and_the_flow_parameters_match_them() -> None:
    import typing

    from prefixflow.flows.flow import batch_inference
    from prefixflow.pipeline.job.flags import JOB_OPTIONS, SHORTCUTS, STORAGE_OPTIONS, comma_list, key_value

    by_name = {o.name: o for o in (*JOB_OPTIONS, *STORAGE_OPTIONS)}
    assert by_name["max_tokens"].parse is int and by_name["temperature"].parse is float  # SamplingSection's
    assert by_name["shard_rows"].parse is int and by_name["labels"].parse is comma_list
    assert SHORTCUTS["max_tokens"] == ("sampling", "max_tokens") and SHORTCUTS["label_mode"] == (
        "label",
        "mode",
    )
    expected = {int: int, float: float, str: str, comma_list: list[str], key_value: dict[str, Any]}
    hints = typing.get_type_hints(batch_inference.fn)
    for option in by_name.values():
        if option.parse in expected:  # (num_speculative_tokens: 'auto' or an int)
            assert hints[option.name] == expected[option.parse] | None, option.name

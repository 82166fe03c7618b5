"""The `plan --advise` flags and command, kept here so the CLI module only wires them in."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

from prefixflow.pipeline.advisor.advise import DEFAULT_SAMPLE_ROWS
from prefixflow.pipeline.advisor.devices import CHOICES
from prefixflow.pipeline.errors import JobConfigError


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def add_advise_flags(plan: argparse.ArgumentParser) -> None:
    group = plan.add_argument_group("workload advisor (docs/advisor.md)")
    group.add_argument(
        "--advise",
        action="store_true",
        help="answer the six configuration questions from a sample of the input "
        "(no weights, no torch unless --pilot)",
    )
    group.add_argument(
        "--gpu",
        default="local",
        type=str.lower,
        help=f"target device: {', '.join(CHOICES)} (default: local, the first GPU nvidia-smi "
        "reports, else the CPU)",
    )
    group.add_argument(
        "--sample-rows",
        type=_positive,
        default=DEFAULT_SAMPLE_ROWS,
        help=f"rows to sample, spread over all shards (default {DEFAULT_SAMPLE_ROWS})",
    )
    group.add_argument(
        "--pilot",
        type=_positive,
        default=None,
        metavar="N",
        help="also generate N sampled rows with the real engine (loads the model) to measure "
        "output lengths, prefix hits and speed",
    )


def advise_requested(args: argparse.Namespace) -> bool:
    """--gpu, --sample-rows or --pilot without --advise is a mistake worth a clear message."""
    if getattr(args, "advise", False):
        return True
    if (
        getattr(args, "pilot", None)
        or getattr(args, "gpu", "local") != "local"
        or getattr(args, "sample_rows", DEFAULT_SAMPLE_ROWS) != DEFAULT_SAMPLE_ROWS
    ):
        raise JobConfigError("--gpu, --sample-rows and --pilot apply to `plan --advise`; add --advise")
    return False


def run_advice(
    spec: Any, args: argparse.Namespace, console: Console, plan_json: dict[str, Any] | None
) -> int:
    """Print the advice on ``console`` (the CLI passes its stdout console), or with --json add it as ``advise`` to the plan's JSON."""
    from prefixflow.pipeline.advisor.advise import advise
    from prefixflow.pipeline.advisor.report import engine_settings, print_advice

    try:
        advice = advise(spec, gpu=args.gpu, sample_size=args.sample_rows, pilot_rows=args.pilot or 0)
    except ImportError as exc:
        if not args.pilot:
            raise
        raise JobConfigError(
            f"--pilot runs the engine, which needs torch ({exc}); install prefixflow's "
            "engine dependencies or leave --pilot out"
        ) from exc
    if plan_json is not None:
        print(json.dumps({**plan_json, "advise": {**advice.as_dict(), "engine": engine_settings(advice)}}))
        return 0
    print_advice(console, advice)
    return 0

"""The `prefixflow` console script: `serve` (the batch_inference flow as a scheduled Prefect
deployment) is handled here; run, plan, status and demo go to pipeline.cli (flows -> pipeline).

Prefect is imported only when `serve` runs, so the other commands work without it installed. With
`--work-pool` the deployment is registered on a work pool instead (a `prefect worker start -p POOL`
runs it) and the command exits.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from prefixflow.pipeline.job.flags import add_job_flags, add_new_run_flag, overrides_from_args

SERVE_HELP = "serve a job as a scheduled Prefect deployment (needs prefect)"

EPILOG = """examples:
  prefixflow serve --name nightly --cron "0 2 * * *" --input s3://bucket/docs/ --output s3://bucket/out/ \\
      --job configs/jobs/summarize.yaml
  prefixflow serve --interval 3600 --input data/ --output out/ --model tiny --lanes 2
  prefixflow serve --work-pool gpu-pool --cron "0 * * * *" --input data/ --output out/
A scheduled run resumes into the same OUTPUT: committed shards are skipped, new input rows run."""


def _positive_seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _resources(text: str) -> dict[str, float]:
    import json

    try:
        value = json.loads(text)
        return {str(k): float(v) for k, v in value.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise argparse.ArgumentTypeError(
            f'expected a JSON object of resource amounts such as {{"lane": 1}}, got {text!r}'
        ) from exc


def build_parser() -> argparse.ArgumentParser:
    """Job flags as in `prefixflow run`, then lane, schedule and deployment flags."""
    from prefixflow.flows.slots import DEFAULT_LIMIT  # imports prefect: only when `serve` runs

    p = argparse.ArgumentParser(
        prog="prefixflow serve",
        description="Serve the batch-inference flow as a Prefect deployment, on a schedule.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    job = p.add_argument_group("job (as in `prefixflow run`)")
    add_job_flags(job)
    add_new_run_flag(job)
    job.add_argument(
        "--credentials-block",
        metavar="NAME",
        help="Prefect Secret block (secret/NAME) whose value is a JSON object of storage options "
        "such as key/secret; without it, credentials come from the environment or AWS profile",
    )

    lanes = p.add_argument_group("engine lanes")
    lanes.add_argument("--lanes", type=int, help="number of engine lanes (default: one per GPU, 1 on CPU)")
    lanes.add_argument("--gpus-per-lane", type=int, help="GPUs per lane (default: 1 if GPUs exist, else 0)")
    lanes.add_argument("--ray-address", help="run lanes on a Ray cluster: auto, ray://head:10001, head:6379")
    lanes.add_argument(
        "--lane-resources",
        type=_resources,
        metavar="JSON",
        help="custom Ray resources each lane asks for, e.g. '{\"lane\": 1}' (one lane per node "
        "started with --resources='{\"lane\": 1}')",
    )
    lanes.add_argument("--lane-retries", type=int, default=2, help="retries per lane (default: 2)")
    lanes.add_argument("--retry-delay", type=float, default=10.0, help="first retry delay, doubled each time")
    lanes.add_argument("--lane-timeout", type=float, help="seconds before a lane attempt is failed")
    lanes.add_argument(
        "--concurrency-limit",
        default=DEFAULT_LIMIT,
        help=f"name prefix of the per-device concurrency limits lanes hold ({DEFAULT_LIMIT}-gpu-<id>, "
        f"{DEFAULT_LIMIT}-cpu; default: {DEFAULT_LIMIT}; 'none' for no limit)",
    )

    dep = p.add_argument_group("deployment")
    dep.add_argument("--name", default="prefixflow", help="deployment name (default: prefixflow)")
    dep.add_argument(
        "--cron", action="append", default=[], help='cron schedule, e.g. "0 2 * * *" (repeatable)'
    )
    dep.add_argument(
        "--interval",
        type=_positive_seconds,
        action="append",
        default=[],
        metavar="SECONDS",
        help="run every SECONDS seconds (repeatable; combines with --cron)",
    )
    dep.add_argument("--timezone", help="time zone of the cron schedules (default: UTC)")
    dep.add_argument("--tag", action="append", default=[], help="deployment tag (repeatable)")
    dep.add_argument("--work-pool", help="register on this work pool and exit instead of serving")
    dep.add_argument(
        "--source", help="with --work-pool: where workers fetch the code (default: this checkout)"
    )
    return p


def flow_parameters(args: argparse.Namespace) -> dict[str, Any]:
    """The batch_inference parameters a scheduled run gets (unset flags are left to defaults). Raises
    JobConfigError for credential-like storage options: deployment parameters are stored in plain text."""
    from prefixflow.flows.credentials import refuse_plain_secrets

    overrides = overrides_from_args(args)
    refuse_plain_secrets(overrides.get("storage_options"), overrides.get("endpoint_url"))
    params: dict[str, Any] = {
        "input": args.input,
        "output": args.output,
        "model": args.model,
        "job": args.job,
        **overrides,
        "credentials_block": args.credentials_block,
        "new_run": args.new_run or None,
        "lanes": args.lanes,
        "gpus_per_lane": args.gpus_per_lane,
        "ray_address": args.ray_address,
        "lane_resources": args.lane_resources,
        "lane_retries": args.lane_retries,
        "retry_delay_s": args.retry_delay,
        "lane_timeout_s": args.lane_timeout,
        "concurrency_limit": None
        if str(args.concurrency_limit).lower() == "none"
        else args.concurrency_limit,
    }
    return {k: v for k, v in params.items() if v is not None or k == "concurrency_limit"}


def schedules(args: argparse.Namespace) -> list[Any]:
    """Prefect schedules from the --cron and --interval flags."""
    from prefect.schedules import Cron, Interval

    return [Cron(c, timezone=args.timezone) for c in args.cron] + [Interval(s) for s in args.interval]


def main(argv: list[str] | None = None) -> int:
    """`prefixflow COMMAND ...`: `serve` here, every other command in pipeline.cli."""
    from prefixflow.pipeline.cli import main as pipeline_main

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":
        try:
            import prefect  # noqa: F401
        except ImportError as exc:
            print(f"prefixflow serve needs prefect (pip install prefect): {exc}", file=sys.stderr)
            return 2
        return int(serve_main(argv[1:]) or 0)
    return pipeline_main(argv, extra_commands={"serve": SERVE_HELP})


def serve_main(argv: list[str] | None = None) -> int:
    """Entry point of `prefixflow serve`. Blocks while serving; SIGINT or SIGTERM stops it."""
    from prefixflow.pipeline import PipelineError

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        parameters = flow_parameters(args)
    except PipelineError as exc:
        print(f"prefixflow serve: error: {exc}", file=sys.stderr)
        return 2
    if not args.cron and not args.interval:
        print(
            "prefixflow serve: no schedule given; runs start only when triggered "
            "(add --cron or --interval for a schedule)",
            file=sys.stderr,
        )
    from prefixflow.flows.flow import batch_inference

    common: dict[str, Any] = {
        "schedules": schedules(args),
        "parameters": parameters,
        "tags": args.tag or None,
        "description": f"prefixflow batch inference {args.input} -> {args.output}",
    }
    if args.work_pool:
        return _register_on_pool(args, common)
    from prefect.deployments.runner import EntrypointType

    if threading.current_thread() is threading.main_thread():
        # Until Prefect's runner installs its own SIGTERM handler, SIGTERM stops serving cleanly too.
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        # One run at a time per deployment: two runs writing one OUTPUT would only race for shards.
        batch_inference.serve(
            name=args.name, global_limit=1, entrypoint_type=EntrypointType.MODULE_PATH, **common
        )
    except KeyboardInterrupt:
        pass
    print(f"prefixflow serve: stopped serving batch-inference/{args.name}", file=sys.stderr)
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _register_on_pool(args: argparse.Namespace, common: dict[str, Any]) -> int:
    """Create or update the deployment on a work pool; a worker polling that pool runs it."""
    from prefect import Flow

    source = args.source or str(Path(__file__).resolve().parents[1])
    flow = Flow.from_source(source=source, entrypoint="flows/flow.py:batch_inference")
    deployment_id = flow.deploy(
        name=args.name, work_pool_name=args.work_pool, build=False, push=False, concurrency_limit=1, **common
    )
    print(
        f"registered deployment batch-inference/{args.name} ({deployment_id}) on work pool {args.work_pool}; "
        f"start a worker with: prefect worker start -p {args.work_pool}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

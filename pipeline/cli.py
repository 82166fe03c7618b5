"""`prefixflow`: run, plan, status and demo from a shell.

The `prefixflow` console script is flows.cli:main, which handles `serve` itself and hands every other
command to ``main`` here (flows -> pipeline; the pipeline never imports flows)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from prefixflow.pipeline.errors import JobConfigError, PipelineError
from prefixflow.pipeline.interrupts import INTERRUPTED_HINT, Terminated, interruptible
from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.job.flags import (
    DEFAULT_MODEL,
    add_job_flags,
    add_new_run_flag,
    add_storage_flags,
    overrides_from_args,
)
from prefixflow.pipeline.storage.errors import (
    RESUME_HINT,
    describe_storage_error,
    storage_problem,
    transient_problem,
)

if TYPE_CHECKING:
    from prefixflow.pipeline.job.spec import JobSpec

EPILOG = """examples:
  prefixflow demo
  prefixflow plan --input data/docs/ --job configs/jobs/summarize.yaml
  prefixflow run --input s3://bucket/docs/ --output s3://bucket/out/ --job configs/jobs/summarize.yaml
  prefixflow status s3://bucket/out/
Results land in OUTPUT/data/**/*.parquet (one row per input row, exactly once)."""


RUN_DESCRIPTION = """Turn every input row into exactly one output row.
Rerunning the same command resumes: committed shards are skipped and rows already flushed are kept.
Rerunning with different settings (or another model or dtype) is refused: the job fingerprint differs.
--new-run discards such an earlier run and starts over; a run with the same fingerprint is resumed.
A bad row becomes an error row (see the error_class column); an unreadable file fails only its shard.
An OpenAI Batch file (.jsonl) runs too: --output results.jsonl (docs/openai-batch.md).
Results and the summary go to stdout; progress, logs and warnings to stderr (a bar on a terminal,
a plain line every --progress-interval seconds otherwise)."""

PLAN_DESCRIPTION = """Show how the input splits into shards, without loading a model or writing anything.
Each line is one shard (a file and a row range) with its estimated tokens. shard_rows is a target:
shards are cut at Parquet row-group boundaries, so sizes come out as whole row groups (a row group
larger than twice the target is split). The effective sizes are listed. Exit code 2 when the input
is not Parquet or a file cannot be read. An OpenAI Batch file is described request by request."""

DEMO_DESCRIPTION = """Write 24 bundled product reviews to Parquet, then run a summarization job and a labeling job
on them end to end and show sample results and how to read them.
Each model's results go to their own folder, WORKDIR/<model>/, so a demo with another model never
replaces earlier results; rerunning with the same model resumes (nothing is redone).
--model tiny runs the random test preset in seconds (its text is gibberish)."""

STATUS_DESCRIPTION = """Where a run stands, from its output folder alone: shards committed of the planned total, rows,
errors by class, tokens (prompt, cached, output), throughput, and the throughput over time per lane."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("prefixflow")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser(extra_commands: dict[str, str] | None = None) -> argparse.ArgumentParser:
    """The run/plan/status/demo parser; ``extra_commands`` (name -> help) are listed in --help only
    (flows.cli passes `serve`, which it handles itself)."""
    parser = argparse.ArgumentParser(
        prog="prefixflow",
        description="Offline LLM batch inference: Parquet in, Parquet out, exactly once.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"prefixflow {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="run (or resume) a job",
        epilog=EPILOG,
        description=RUN_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_flags(run, need_output=True)
    add_new_run_flag(run)
    run.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    run.add_argument(
        "--progress-interval",
        type=float,
        metavar="SECONDS",
        help="without a terminal: seconds between progress lines (default 15)",
    )
    run.add_argument(
        "--json", action="store_true", help="print the summary as JSON on stdout (the table goes to stderr)"
    )
    add_threads_flag(run)
    plan = sub.add_parser(
        "plan",
        help="show the shards and sizes without running anything",
        description=PLAN_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_flags(plan, need_output=False)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
    from prefixflow.pipeline.advisor.cli import add_advise_flags

    add_advise_flags(plan)
    status = sub.add_parser(
        "status", help="progress and totals of a run, finished or not", description=STATUS_DESCRIPTION
    )
    status.add_argument("output", help="the run's output folder or s3:// URL")
    add_storage_flags(status)
    status.add_argument("--json", action="store_true", help="print the status as JSON on stdout")
    demo = sub.add_parser(
        "demo",
        help="summarize, label and extract from a small bundled dataset end to end",
        description=DEMO_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--workdir", default="prefixflow-demo", help="where to write data and results")
    demo.add_argument("--model", default=DEFAULT_MODEL, help="model (use 'tiny' for the random preset)")
    demo.add_argument("--rows", type=int, default=24, help="how many sample documents to use (max 24)")
    add_threads_flag(demo)
    for name, text in (extra_commands or {}).items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_threads_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=_positive_int,
        metavar="N",
        help="CPU threads for the model's matmuls (default: the usable cores minus one per 8, at least "
        "1, so grammar, tokenizer and I/O threads keep a core; OMP_NUM_THREADS, if set, is kept)",
    )


def _storage(args: argparse.Namespace) -> StorageConfig:
    return StorageConfig(endpoint_url=args.endpoint_url, options=dict(args.storage_options or []))


def _spec(args: argparse.Namespace, output: str) -> JobSpec:
    from prefixflow.pipeline.job.spec import load_job

    return load_job(args.input, output, args.model, args.job, **overrides_from_args(args))


def cmd_run_batch(args: argparse.Namespace, out: Console, err: Console) -> int:
    """An OpenAI Batch JSONL file in, a results JSONL file out (see pipeline/run/batch_run.py)."""
    from prefixflow.pipeline.local_run import print_summary, run_local
    from prefixflow.pipeline.run.batch_run import cleanup_inputs, driving_batch, write_results

    overrides = {
        k: v for k, v in overrides_from_args(args).items() if k not in ("id_column", "prompt_column")
    }
    if args.id_column or args.prompt_column:
        err.print(
            "[yellow]note:[/] --id-column and --prompt-column do not apply to an OpenAI Batch file "
            "(custom_id and the request bodies are used)"
        )
    with driving_batch(
        args.input, args.output, args.model, args.job, new_run=args.new_run, **overrides
    ) as batch:
        err.print(
            f"OpenAI Batch file: {batch.num_requests} requests; run state in {batch.spec.output}",
            soft_wrap=True,
        )
        summary, failures = run_local(
            batch.spec,
            new_run=args.new_run,
            progress=False if args.no_progress else None,
            console=err,
            progress_interval=args.progress_interval,
        )
        cleanup_inputs(batch)
        written = write_results(batch) if summary.complete and not failures else 0
    print_summary(err if args.json else out, summary, batch.spec.config.storage)
    if args.json:
        print(
            json.dumps(
                {
                    **summary.as_dict(),
                    "results": batch.results if written else None,
                    "failed_shards": [str(f) for f in failures],
                }
            )
        )
    if not written:
        err.print(
            f"[red]{len(failures)} shard(s) failed[/]; no results file written. Fix the cause and run the "
            "same command to resume"
        )
        return 1
    (err if args.json else out).print(
        f"wrote {written} result lines to {batch.results}", soft_wrap=True, markup=False
    )
    return 0


def cmd_run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from prefixflow.pipeline.local_run import print_summary, run_local
    from prefixflow.pipeline.run.batch_run import is_batch_input

    if is_batch_input(args.input, _storage(args)):
        return cmd_run_batch(args, out, err)
    spec = _spec(args, args.output)
    summary, failures = run_local(
        spec,
        new_run=args.new_run,
        progress=False if args.no_progress else None,
        console=err,
        progress_interval=args.progress_interval,
    )
    print_summary(err if args.json else out, summary, spec.config.storage)
    if args.json:
        print(json.dumps({**summary.as_dict(), "failed_shards": [str(f) for f in failures]}))
    if failures:
        err.print(
            f"[red]{len(failures)} shard(s) failed[/]; fix the input and run the same command to resume"
        )
        return 1
    return 0


def cmd_plan_batch(args: argparse.Namespace, out: Console, err: Console) -> int:
    """An OpenAI Batch file: request counts and the requests that would be answered with an error."""
    from prefixflow.pipeline.run.batch_run import read_batch_file
    from prefixflow.pipeline.tasks.openai_batch import describe_requests

    info = describe_requests(read_batch_file(args.input, _storage(args)))
    if args.json:
        print(json.dumps(info))
        return 0
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(info["kinds"].items()))
    out.print(
        f"OpenAI Batch file {args.input}: {info['requests']} requests ({kinds})", soft_wrap=True, markup=False
    )
    for r in info["refused"]:
        out.print(
            f"  line {r['line']} ({r['custom_id']}): will get a 400 response: {r['error']}",
            markup=False,
            soft_wrap=True,
        )
    return 0


def cmd_plan(args: argparse.Namespace, out: Console, err: Console) -> int:
    from prefixflow.pipeline.advisor.cli import advise_requested
    from prefixflow.pipeline.run.batch_run import is_batch_input

    advising = advise_requested(args)
    if is_batch_input(args.input, _storage(args)):
        if advising:
            raise JobConfigError(
                "--advise reads Parquet input with a job config; for an OpenAI Batch file, "
                "`plan` lists its requests"
            )
        return cmd_plan_batch(args, out, err)
    spec = _spec(args, "")
    from prefixflow.pipeline.storage.sources import reads_cached

    with reads_cached():  # each input file read once for the whole plan
        return _plan(spec, args, out, err, advising)


def _plan(spec: JobSpec, args: argparse.Namespace, out: Console, err: Console, advising: bool) -> int:
    from prefixflow.pipeline.advisor.cli import run_advice
    from prefixflow.pipeline.run.planning import describe_shards, plan_shards

    shards = plan_shards(spec)
    broken = [s.error for s in shards if s.error]
    target = spec.config.output.shard_rows
    sizes = [s.num_rows for s in shards if not s.error]
    if args.json:
        infos = describe_shards(spec, shards)
        rows = [
            {
                "shard_id": i.shard.shard_id,
                "path": i.shard.path,
                "rows": [i.shard.row_start, i.shard.row_end],
                "num_rows": i.shard.num_rows,
                "est_tokens": i.est_tokens,
                "prefix_key": i.prefix_key,
                "error": i.shard.error,
                "files": [[p.relpath, p.row_start, p.row_end] for p in i.shard.ranges()],
            }
            for i in infos
        ]
        plan = {
            "shards": rows,
            "num_rows": sum(s.num_rows for s in shards),
            "shard_rows": target,
            "shard_sizes": sizes,
        }
        if advising:
            run_advice(spec, args, out, plan)
        else:
            print(json.dumps(plan))
    elif advising:  # the advice counts tokens for real; the per-shard listing would only bury it
        out.print(f"[bold]{len(shards)} shards, {sum(s.num_rows for s in shards)} rows[/]")
        run_advice(spec, args, out, None)
    else:
        infos = describe_shards(spec, shards)
        for i in infos:
            note = f"  [red]{escape(i.shard.error)}[/]" if i.shard.error else ""
            where = (
                f"{len(i.shard.pieces)} small files packed"
                if i.shard.pieces
                else f"rows {i.shard.row_start}-{i.shard.row_end}"
            )
            out.print(f"{i.shard.shard_id}  {where} ({i.shard.num_rows} rows)  ~{i.est_tokens} tokens{note}")
        out.print(
            f"[bold]{len(infos)} shards, {sum(i.shard.num_rows for i in infos)} rows, "
            f"~{sum(i.est_tokens for i in infos)} tokens[/]"
        )
        out.print(
            f"shard_rows {target}: effective shard sizes {_sizes_text(sizes)} (shards are cut at Parquet "
            "row-group boundaries, so sizes are whole row groups; a row group over twice the target is split)"
        )
    for error in broken:  # a plan that cannot run as given does not pass
        err.print(f"[red]error:[/] {escape(error)}", soft_wrap=True)
    return 2 if broken else 0


def _sizes_text(sizes: list[int]) -> str:
    if not sizes:
        return "none"
    ordered = sorted(sizes)
    if len(ordered) <= 8:
        return "/".join(str(n) for n in sizes) + " rows"
    return f"{ordered[0]}..{ordered[-1]} rows (median {ordered[len(ordered) // 2]})"


def cmd_status(args: argparse.Namespace, out: Console, err: Console) -> int:
    from prefixflow.pipeline.local_run import print_summary
    from prefixflow.pipeline.report.summary import status
    from prefixflow.pipeline.report.throughput_report import throughput_table, usage
    from prefixflow.pipeline.run.throughput_series import load_series, summary_of
    from prefixflow.pipeline.storage.layout import Layout
    from prefixflow.pipeline.storage.store import Store

    storage = StorageConfig(endpoint_url=args.endpoint_url, options=dict(args.storage_options))
    summary, record = status(args.output.rstrip("/"), storage)
    series = load_series(Layout(Store.open(args.output.rstrip("/"), storage)).for_run(record.run_id))
    if args.json:
        print(
            json.dumps(
                {
                    **summary.as_dict(),
                    "model": record.spec["model"],
                    "input": record.spec["input"],
                    "usage": usage(summary.as_dict(), series),
                    "throughput": summary_of(series),
                }
            )
        )
        return 0
    out.print(
        f"input {record.spec['input']}  model {record.spec['model']}  run {record.run_id}  "
        f"fingerprint {record.fingerprint_hash}"
    )
    if summary.foreign_files:
        err.print(
            f"[red]warning:[/] files no prefixflow run wrote are in data/: {', '.join(summary.foreign_files[:8])}; "
            "readers of data/**/*.parquet see their rows too. Move them out of the output folder.",
            soft_wrap=True,
        )
    if summary.replaced_runs:
        err.print(
            f"[yellow]note:[/] {', '.join(summary.replaced_runs)} hold rows of a replaced run (a --new-run "
            "was interrupted); the next `prefixflow run` of this job removes them",
            soft_wrap=True,
        )
    if summary.shards_lost:
        err.print(
            f"[red]warning:[/] committed parts of {len(summary.shards_lost)} shard(s) were deleted "
            f"({', '.join(summary.shards_lost[:5])}); data/ lacks their rows. The next `prefixflow run` of "
            "this job generates them again",
            soft_wrap=True,
        )
    if summary.shards_unpublished:
        err.print(
            f"[yellow]note:[/] {len(summary.shards_unpublished)} shard(s) committed but not yet published "
            f"to data/ ({', '.join(summary.shards_unpublished[:5])}; a run was killed in between): "
            f"readers see {summary.rows_published} of {summary.rows} committed rows. The next `prefixflow "
            "run` of this job publishes them",
            soft_wrap=True,
        )
    if summary.orphan_parts:
        err.print(
            f"[yellow]note:[/] data/ holds {len(summary.orphan_parts)} part(s) no commit marker lists "
            f"({', '.join(summary.orphan_parts[:3])}; a marker was deleted, or a run stopped between "
            "writing a shard and committing it, or is committing it now): the next `prefixflow run` "
            "replaces them",
            soft_wrap=True,
        )
    print_summary(out, summary, storage)
    if series:
        out.print(throughput_table(series))
    out.print(
        "finished" if summary.complete else "not finished: run the same `prefixflow run` command to resume"
    )
    return 0


def main(argv: list[str] | None = None, extra_commands: dict[str, str] | None = None) -> int:
    """run, plan, status, demo. ``extra_commands`` are only listed in --help (their caller runs them)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":
        print(
            "`serve` is a flows command: run `prefixflow serve ...` (or `python -m prefixflow.flows.cli serve ...`)",
            file=sys.stderr,
        )
        return 2
    args = build_parser(extra_commands).parse_args(argv)
    err = Console(stderr=True)  # progress, logs, warnings
    out = Console()  # results and reports (`prefixflow plan > plan.txt` keeps the plan)
    with interruptible():
        try:
            return _dispatch(args, out, err)
        except PipelineError as exc:
            transient = transient_problem(exc)
            if transient is not None:  # a run can resume from this: exit 1, like a failed shard
                err.print(
                    f"[red]error:[/] {escape(f'{exc}; {RESUME_HINT}')}", soft_wrap=True, highlight=False
                )
                return 1
            hint = describe_storage_error(exc)
            message = f"{exc}. Fix: {hint}" if hint else str(exc)
            err.print(f"[red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)
            return 2
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (see interruptible)
            err.print(f"interrupted; {INTERRUPTED_HINT}", soft_wrap=True)
            return 128 + (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)
        except (
            Exception
        ) as exc:  # storage failures deep in s3fs/botocore: one line, like every other bad path
            transient = transient_problem(exc)
            if transient is not None:
                urls = " and ".join(
                    dict.fromkeys(
                        u for u in (getattr(args, "input", None), getattr(args, "output", None)) if u
                    )
                )
                err.print(
                    f"[red]error:[/] {escape(f'{args.command} {urls}: {transient}; {RESUME_HINT}')}",
                    soft_wrap=True,
                    highlight=False,
                )
                return 1
            hint = describe_storage_error(exc)
            urls = " and ".join(
                dict.fromkeys(u for u in (getattr(args, "input", None), getattr(args, "output", None)) if u)
            )
            problem = f"{args.command} {urls}: {hint}" if hint is not None else storage_problem(exc)
            if problem is None:
                raise
            err.print(f"[red]error:[/] {escape(problem)}", soft_wrap=True, highlight=False)
            return 2


def _dispatch(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.command == "plan":
        return cmd_plan(args, out, err)
    if args.command == "status":
        return cmd_status(args, out, err)
    from prefixflow.pipeline.engine_access import set_cpu_threads

    threads = set_cpu_threads(args.threads)  # before any engine exists (torch's pool is process-wide)
    if args.command == "run":
        return cmd_run(args, out, err)
    from prefixflow.pipeline.demo import run_demo

    return run_demo(args.workdir, args.model, args.rows, err, report=out, threads=threads)


if __name__ == "__main__":
    sys.exit(main())

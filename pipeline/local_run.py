"""Run a whole job in this process (the CLI's `run` and `demo`): plan, prepare, shards, finalize.

Scale-out belongs to flows/; this is the one-lane path, and it shares every step with it.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from prefixflow.pipeline.advisor.compare import record_prediction
from prefixflow.pipeline.engine_access import Engine
from prefixflow.pipeline.errors import ShardError
from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.job.spec import JobSpec, open_engine
from prefixflow.pipeline.report.label_charts import report_lines
from prefixflow.pipeline.report.progress import ProgressDisplay
from prefixflow.pipeline.report.summary import RunSummary, finalize
from prefixflow.pipeline.run.commit import committed_ids
from prefixflow.pipeline.run.handle import open_run
from prefixflow.pipeline.run.planning import plan_shards, read_input_facts
from prefixflow.pipeline.run.record import CLI_DRIVER, CheckedOutput, check_output, hold_output, prepare
from prefixflow.pipeline.run.shard_execution import run_shards
from prefixflow.pipeline.storage import slow
from prefixflow.pipeline.storage.read_hint import polars_hint
from prefixflow.pipeline.storage.shards import Shard
from prefixflow.pipeline.storage.sources import reads_cached
from prefixflow.pipeline.tasks.rows import check_max_tokens, check_sampling_vocabulary


def run_local(
    spec: JobSpec,
    new_run: bool = False,
    llm: Engine | None = None,
    progress: bool | None = None,
    console: Console | None = None,
    progress_interval: float | None = None,
) -> tuple[RunSummary, list[ShardError]]:
    """Every shard of the job, one after another; a failing shard is reported, the others still run.

    Everything that can fail on a bad job (model, engine settings, columns, output root) fails before
    the run record is written: the engine is loaded first when any shard is left to run."""
    console = console or Console(stderr=True)

    def storage(text: str, still_slow: bool) -> None:  # slow storage outside the shard loop
        console.print(Text(text, style="yellow" if still_slow else ""), soft_wrap=True)

    with slow.watch(storage), reads_cached():  # each input file is read once in the whole command
        return _run_local(spec, new_run, llm, progress, console, progress_interval)


def _run_local(
    spec: JobSpec,
    new_run: bool,
    llm: Engine | None,
    progress: bool | None,
    console: Console,
    progress_interval: float | None,
) -> tuple[RunSummary, list[ShardError]]:
    shards = plan_shards(spec, new_run=new_run)
    inputs = read_input_facts(spec)  # the input's schemas and identities, read once for the command
    checked = check_output(spec, new_run, inputs)  # fail fast, before the engine loads; prepare reuses it
    owned = llm is None
    if llm is None and (new_run or _left_to_run(checked, shards)):
        llm = open_engine(spec)
    try:
        if llm is not None:
            check_max_tokens(spec.config, llm.max_model_len)
            check_sampling_vocabulary(spec.config, llm.vocab_size)
        failures: list[ShardError] = []
        with hold_output(checked.layout, driver=CLI_DRIVER):
            # prepare_run's two steps, taken here so the spec goes record -> handle once, not back and
            # forth (benchmarks/module_walk.py); the record prepare writes or checks is not read again
            read_at = time.monotonic()
            record, markers = prepare(spec, new_run, checked)
            run = open_run(spec, checked.layout.store, shards, markers, record, read_at)
            todo = [s for s in shards if not run.is_committed(s.shard_id)]
            console.print(
                f"[bold]{len(shards)}[/] shards, {sum(s.num_rows for s in shards)} rows; "
                f"{len(shards) - len(todo)} already committed"
            )
            if todo:
                record_prediction(
                    run, shards, warn=lambda text: console.print(f"[yellow]{text}[/]", soft_wrap=True)
                )
                llm = llm or open_engine(spec)
                if spec.task.keeps_run_state(spec.config):  # a label prior: made at plan time, the sample's
                    run.cached(
                        "task_state",
                        lambda: spec.task.run_state(  # prompts then sit in the prefix cache
                            spec,
                            run.layout,
                            run.fingerprint,
                            llm,
                            shards,
                            warn=lambda text: console.print(f"[yellow]warning:[/] {text}", soft_wrap=True),
                        ),
                    )
                mode = "off" if progress is False else "bar" if progress else "auto"
                with ProgressDisplay(
                    sum(s.num_rows for s in todo),
                    mode=mode,
                    engine_stats=getattr(llm, "stats", None),
                    console=console,
                    log_every_s=progress_interval,
                ) as bar:
                    for outcome in run_shards(run, todo, llm, progress=bar):
                        if outcome.error is not None:
                            failures.append(outcome.error)
                            console.print(f"[red]shard failed[/] {outcome.error}", soft_wrap=True)
            return finalize(run), failures
    finally:
        close = getattr(llm, "close", None) if owned else None
        if close is not None:
            close()  # tensor-parallel worker processes leave with the run


def _left_to_run(checked: CheckedOutput, shards: list[Shard]) -> bool:
    """Whether a shard of the plan is not committed yet (also when the output holds no run of this job):
    one listing of the run's markers, before the engine is loaded for nothing."""
    existing = checked.existing
    if existing is None or existing.fingerprint_hash != checked.fresh.fingerprint_hash:
        return True
    done = committed_ids(checked.layout.for_run(existing.run_id))
    return any(s.shard_id not in done for s in shards)


def print_summary(console: Console, summary: RunSummary, storage: StorageConfig | None = None) -> None:
    """The closing summary: the table, then where the rows are and the polars call that reads them,
    with the storage options it needs (unwrapped, so it can be copied)."""
    console.print(summary_table(summary))
    if summary.predicted_vs_measured:
        console.print(comparison_table(summary.predicted_vs_measured))
    console.print(
        f"results: {summary.data_glob}   read with {polars_hint(summary.data_glob, storage)}",
        soft_wrap=True,
        markup=False,
    )


def summary_table(summary: RunSummary) -> Table:
    t = Table(title="prefixflow run summary", show_header=False)
    total = "?" if summary.shards_total is None else str(summary.shards_total)
    rows = [
        ("output", summary.output),
        (
            "shards committed",
            f"{summary.shards_committed} / {total}" + ("" if summary.complete else "  (incomplete)"),
        ),
        ("rows", f"{summary.rows}  ({summary.error_rows} error rows)"),
        ("errors by class", ", ".join(f"{k}={v}" for k, v in summary.errors_by_class.items()) or "none"),
        (
            "tokens",
            f"prompt {summary.prompt_tokens}, cached {summary.cached_tokens}, output {summary.output_tokens}",
        ),
        (
            "throughput",
            f"{summary.tokens_per_s:,.0f} tok/s total, {summary.output_tokens_per_s:,.1f} output tok/s",
        ),
        ("prefix-cache hit rate", f"{summary.prefix_hit_rate:.1%}"),
        ("shard time", f"{summary.elapsed_s:.1f} s"),
        (
            "usage",
            f"prompt {summary.prompt_tokens:,} tokens (cached {summary.cached_tokens:,}), output "
            f"{summary.output_tokens:,} tokens, {summary.device_seconds:,.1f} device-seconds",
        ),
    ]
    if summary.shards_in_progress:
        rows.append(("in progress", ", ".join(summary.shards_in_progress[:5])))
    if summary.label_counts:
        rows.append(("labels", label_shares(summary.label_counts)))
        rows += report_lines(summary)
    for k, v in rows:
        t.add_row(k, Text(v))
    if summary.label_warning:
        t.add_row(Text("warning", style="bold yellow"), Text(summary.label_warning, style="yellow"))
    return t


def comparison_table(rows: list[dict[str, Any]]) -> Table:
    """What the advisor predicted when the run started (docs/advisor.md) next to what the run measured."""
    t = Table(title="predicted vs measured (plan --advise)")
    for col in ("metric", "predicted", "measured", ""):
        t.add_column(col)
    for r in rows:
        t.add_row(
            Text(str(r["metric"])),
            Text(str(r["predicted"])),
            Text(str(r["measured"])),
            Text(str(r["verdict"])),
        )
    return t


def label_shares(counts: dict[str, int]) -> str:
    """``billing 97% (291), shipping 2% (6)``: the committed rows per label, most frequent first."""
    total = sum(counts.values()) or 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{label} {n / total:.0%} ({n})" for label, n in ranked)

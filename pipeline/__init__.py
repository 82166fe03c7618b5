"""prefixflow's data pipeline: Parquet in (local or any fsspec URL), prompts to the engine, exactly-once
Parquet out. The functions below are the contract the flows layer codes against (docs/contracts.md)."""

from prefixflow.pipeline.advisor.compare import record_prediction
from prefixflow.pipeline.engine_access import Engine
from prefixflow.pipeline.errors import (
    FingerprintMismatch,
    InputChanged,
    InputError,
    JobConfigError,
    OutputBusy,
    OutputNotPrepared,
    OutputStateError,
    PipelineError,
    RunSuperseded,
    ShardError,
)
from prefixflow.pipeline.job.config import JobConfig
from prefixflow.pipeline.job.flags import DEFAULT_MODEL
from prefixflow.pipeline.job.spec import JobSpec, load_job, open_engine
from prefixflow.pipeline.report.label_charts import markdown_labels
from prefixflow.pipeline.report.progress import ProgressDisplay
from prefixflow.pipeline.report.summary import RunSummary, finalize, status
from prefixflow.pipeline.run.commit import CommitMarker
from prefixflow.pipeline.run.handle import Run, open_run, prepare_run
from prefixflow.pipeline.run.planning import ShardInfo, describe_shards, plan_shards
from prefixflow.pipeline.run.record import RunRecord, hold_output, prepare_output
from prefixflow.pipeline.run.shard_execution import (
    ProgressSink,
    ShardOutcome,
    ShardResult,
    run_shard,
    run_shards,
)
from prefixflow.pipeline.storage.shards import Shard

if __name__ != "prefixflow.pipeline":  # every file has one import path (docs/architecture.md, Packaging)
    raise ImportError(
        f"import prefixflow.pipeline, not {__name__}: pipeline/ is the prefixflow.pipeline package"
    )

__all__ = [
    "CommitMarker",
    "DEFAULT_MODEL",
    "Engine",
    "FingerprintMismatch",
    "InputChanged",
    "InputError",
    "JobConfig",
    "JobConfigError",
    "JobSpec",
    "OutputBusy",
    "OutputNotPrepared",
    "OutputStateError",
    "PipelineError",
    "ProgressSink",
    "Run",
    "RunRecord",
    "RunSummary",
    "markdown_labels",
    "RunSuperseded",
    "Shard",
    "ShardError",
    "ShardInfo",
    "ShardOutcome",
    "ShardResult",
    "describe_shards",
    "finalize",
    "hold_output",
    "load_job",
    "open_engine",
    "open_run",
    "plan_shards",
    "prepare_output",
    "prepare_run",
    "ProgressDisplay",
    "record_prediction",
    "run_shard",
    "run_shards",
    "status",
    "throughput_markdown",
]


def throughput_markdown(run: Run) -> str:
    """The run's usage and throughput over time as Markdown (for the flow's artifact)."""
    from prefixflow.pipeline.report.throughput_report import markdown_report

    return markdown_report(run.spec.output, run.layout)

"""The `batch_inference` flow: plan shards, run engine lanes, summarize."""

import time
from contextlib import AbstractContextManager, nullcontext
from typing import Annotated, Any

from prefect import Flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture
from prefect.task_runners import TaskRunner
from pydantic import WithJsonSchema

from prefixflow.flows.credentials import (
    SAFE_JOB_SCHEMA,
    SAFE_OPTIONS_SCHEMA,
    SAFE_URL_SCHEMA,
    redact_parameters,
    refuse_plain_secrets,
    with_credentials,
)
from prefixflow.flows.dealing import deal_shards
from prefixflow.flows.driver import drive_output
from prefixflow.flows.lanes import LaneReport, run_lane
from prefixflow.flows.parameters import job_parameters
from prefixflow.flows.reporting import (
    ShardProgress,
    publish_comparison,
    publish_labels,
    publish_summary,
    publish_throughput,
    run_metrics,
)
from prefixflow.flows.slots import DEFAULT_LIMIT
from prefixflow.flows.supervise import supervise_lanes
from prefixflow.flows.task_runners import LaneLayout, lane_layout, make_task_runner, visible_gpus
from prefixflow.pipeline import (
    DEFAULT_MODEL,
    JobSpec,
    ShardInfo,
    describe_shards,
    finalize,
    load_job,
    open_run,
    plan_shards,
    prepare_run,
    record_prediction,
)
from prefixflow.pipeline.job.flags import job_overrides
from prefixflow.pipeline.storage.sources import reads_cached


class ShardsFailed(RuntimeError):
    """Some shards could not be committed after all lane retries."""


class _RedactingFlow(Flow[..., dict[str, Any]]):
    """A Flow whose parameters reach the Prefect API with credential-like storage options redacted
    (the run itself then refuses them: see flows/credentials.py)."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        return super().serialize_parameters(redact_parameters(parameters))


@task(name="plan-shards", persist_result=False, cache_policy=NO_CACHE)
def plan_job(
    input: str,
    output: str,
    model: str,
    job: str | dict[str, Any] | None,
    new_run: bool,
    overrides: dict[str, Any],
    credentials_block: str | None = None,
) -> tuple[JobSpec, list[ShardInfo]]:
    """Validate the job, check or write the output's run record, and describe every shard. The spec
    comes back without the block's credentials (each task that needs them loads the block itself)."""
    logger = get_run_logger()
    spec = load_job(input, output, model, job, **overrides)
    with_keys = with_credentials(spec, credentials_block)
    with reads_cached():  # each input file's footer is read once for all of planning
        shards = plan_shards(with_keys, new_run=new_run)
        run = prepare_run(with_keys, new_run=new_run, shards=shards)
        record_prediction(run, shards, warn=logger.warning)  # compared with the measured totals at the end
        infos = describe_shards(with_keys, shards)
    rows, tokens = sum(i.shard.num_rows for i in infos), sum(i.est_tokens for i in infos)
    logger.info("planned %d shards, %d rows, ~%d tokens", len(infos), rows, tokens)
    return spec, infos


@task(name="summarize-run", persist_result=False, cache_policy=NO_CACHE)
def summarize_run(
    spec: JobSpec,
    reports: list[LaneReport],
    wall_s: float,
    credentials_block: str | None = None,
    resubmits: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Write the manifest through the pipeline's `finalize` (totals from the commit markers;
    `complete` says whether every shard is committed) and publish the summary table artifact.
    `resubmits`: lane attempts whose Ray node or worker died, each resubmitted."""
    # the lanes' own markers: finalize then reads only those of shards committed before this run
    markers = [m for report in reports for m in report.markers]
    run = open_run(with_credentials(spec, credentials_block), markers=markers)
    summary = finalize(run)
    metrics = run_metrics(summary.as_dict(), reports, wall_s)
    metrics.update(run_lane_resubmits=list(resubmits or []), run_nodes=sorted({r.node_id for r in reports}))
    publish_summary(metrics, spec.output)
    publish_labels(summary)
    publish_throughput(run)
    publish_comparison(metrics.get("predicted_vs_measured") or [], spec.output)
    logger = get_run_logger()
    logger.info("run summary: %s", metrics)
    if metrics.get("label_warning"):
        logger.warning("%s", metrics["label_warning"])
    return metrics


@job_parameters(
    {"endpoint_url": WithJsonSchema(SAFE_URL_SCHEMA), "storage_options": WithJsonSchema(SAFE_OPTIONS_SCHEMA)}
)
def batch_inference(
    input: Annotated[str, WithJsonSchema({"type": "string", "not": {"pattern": "://[^/@]*@"}})],
    output: Annotated[str, WithJsonSchema({"type": "string", "not": {"pattern": "://[^/@]*@"}})],
    model: str = DEFAULT_MODEL,
    job: Annotated[str | dict[str, Any] | None, WithJsonSchema(SAFE_JOB_SCHEMA)] = None,
    *,
    credentials_block: str | None = None,
    new_run: bool = False,
    lanes: int | None = None,
    gpus_per_lane: int | None = None,
    ray_address: str | None = None,
    lane_resources: dict[str, float] | None = None,
    lane_retries: int = 2,
    retry_delay_s: float = 10.0,
    lane_timeout_s: float | None = None,
    concurrency_limit: str | None = DEFAULT_LIMIT,
    progress_poll_s: float = 2.0,
    **job_options: Any,
) -> dict[str, Any]:
    """Run an offline batch-inference job as a Prefect flow. The job parameters are the flags of
    `prefixflow run`, generated from the job model (flows/parameters.py; listed under Args).

    Shards are dealt to engine lanes by prefix affinity and token balance; each lane loads its
    engine once and commits its shards one after another. Lanes run on a local thread pool
    (default: one lane per visible GPU, one on CPU) or, with `ray_address` (`auto`,
    `ray://head:10001`), as Ray tasks with `gpus_per_lane` GPUs each (default: one lane per GPU
    in the cluster) and the custom Ray resources `lane_resources` (e.g. {"lane": 1}: one lane per node
    that advertises one). A Ray lane whose node or worker dies is resubmitted (up to `lane_retries`
    times) and runs on a live node. A lane retries `lane_retries` times with exponential backoff from
    `retry_delay_s`, skipping committed shards, and times out after `lane_timeout_s`. A thread
    lane owns its device(s) exclusively while its engine is loaded: it takes the one-slot global
    concurrency limit of each (`<concurrency_limit>-gpu-<id>`, `<concurrency_limit>-cpu`, created
    when missing), waiting while every device is held by another lane or flow, and fails if the
    Prefect API cannot grant them; `concurrency_limit=None` runs without. Ray lanes rely on Ray's
    `num_gpus` scheduling. Shards that still fail leave the flow Failed, after the summary,
    naming each uncommitted shard. With `tensor_parallel_size=N` (or `engine.tensor_parallel_size`
    in the job) each lane's engine spans N GPUs: a lane takes N GPUs (`gpus_per_lane` defaults to N;
    Ray lanes ask for `num_gpus=N`) and the default lane count is the visible GPUs divided by N;
    `pipeline_parallel_size=P` multiplies it: a lane takes P x N GPUs.
    Storage credentials never go in as parameters (Prefect stores those in plain text): they come
    from the environment / AWS credential chain, or from `credentials_block`, a Prefect Secret block
    holding a JSON object of storage options.
    """
    overrides = job_overrides(job_options)  # the job parameters, named as `prefixflow run`'s flags
    engine = job_options.get("engine")
    refuse_plain_secrets(
        job_options.get("storage_options"),
        job_options.get("endpoint_url"),
        job=job,
        input=input,
        output=output,
        ray_address=ray_address,
    )
    logger = get_run_logger()
    started = time.time()
    tp = engine_tensor_parallel_size(input, model, job, overrides)
    # one run per output: a second run of the job into it is refused here, before it plans or writes
    driving = drive_output(
        with_credentials(load_job(input, output, model, job, **overrides), credentials_block), logger
    )
    # built first: an unreachable Ray cluster fails here, before the driver lease writes into the output
    task_runner = make_task_runner(ray_address, lanes or max(1, visible_gpus() // tp))
    with driving, task_runner as runner:
        layout = lane_layout(
            lanes,
            gpus_per_lane,
            on_ray=bool(ray_address),
            tensor_parallel_size=tp,
            lane_resources=lane_resources,
        )
        if layout.on_ray and layout.gpus_per_lane and "device" not in (engine or {}):
            # the flow process may have no GPU while Ray lanes do: pin the device so the job
            # fingerprint (written here, checked in the lanes) resolves dtype "auto" the same way
            overrides["engine"] = {**(engine or {}), "device": "cuda"}
        spec, infos = plan_job(input, output, model, job, new_run, overrides, credentials_block)
        groups = [[info.shard for info in group] for group in deal_shards(infos, layout.lanes)]
        logger.info(
            "%d shards on %d lanes (%s, %d GPU(s) per lane)",
            len(infos),
            len(groups),
            "ray" if layout.on_ray else "threads",
            layout.gpus_per_lane,
        )
        progress = ShardProgress(open_run(with_credentials(spec, credentials_block)), groups)
        lane_task = run_lane.with_options(
            retries=lane_retries,
            retry_delay_seconds=[retry_delay_s * 2**i for i in range(max(1, lane_retries))],
            timeout_seconds=lane_timeout_s,
        )
        submit = _lane_submitter(
            runner, lane_task, spec, groups, layout, concurrency_limit, credentials_block, lane_resources
        )
        lanes_done = supervise_lanes(submit, len(groups), progress, progress_poll_s, lane_retries, logger)
        reports, lane_errors = lanes_done.reports, lanes_done.errors
        for message in lane_errors:
            logger.error(message)

        progress.finish()
        metrics = summarize_run(spec, reports, time.time() - started, credentials_block, lanes_done.resubmits)
        failed = progress.uncommitted()
        if failed:
            raise ShardsFailed(
                f"{len(failed)} of {progress.total} shards not committed after {lane_retries} "
                f"retries: {', '.join(failed)}. Lane errors: {' | '.join(lane_errors)}. "
                "Run the flow again with the same output to resume; committed shards are kept."
            )
        return {**metrics, "lanes": [_lane_row(report) for report in reports]}


def engine_tensor_parallel_size(
    input: str, model: str, job: str | dict[str, Any] | None, overrides: dict[str, Any]
) -> int:
    """The devices each lane's engine spans, tensor x pipeline parallel size (from the flags or the job's
    engine settings), read before the lanes are laid out because it decides how many GPUs each one takes."""
    spec = load_job(input, "", model, job, **overrides)
    engine = spec.config.engine
    return int(engine.get("tensor_parallel_size") or 1) * int(engine.get("pipeline_parallel_size") or 1)


batch_inference = _RedactingFlow(fn=batch_inference, name="batch-inference", persist_result=False)


def _lane_submitter(
    runner: TaskRunner,
    lane_task: Any,
    spec: JobSpec,
    groups: list[list[Any]],
    layout: LaneLayout,
    limit: str | None,
    credentials_block: str | None,
    lane_resources: dict[str, float] | None,
) -> Any:
    """`submit(lane, attempt)` for the supervisor: thread lanes take per-device limits named after
    `limit`; Ray lanes get `num_gpus` and `lane_resources` per task instead (Ray's scheduler keeps
    them apart) and no Ray-side retries (a dead attempt is resubmitted by the supervisor, visibly)."""
    params = {
        "spec": spec,
        "limit": limit if layout.local else None,
        "gpus_per_lane": layout.gpus_per_lane,
        "local": layout.local,
        "credentials_block": credentials_block,
    }
    ray_options: dict[str, Any] = {"max_retries": 0}
    if layout.gpus_per_lane:
        ray_options["num_gpus"] = layout.gpus_per_lane
    if lane_resources:
        ray_options["resources"] = dict(lane_resources)

    def submit(lane: int, attempt: int) -> PrefectFuture[LaneReport]:
        name = f"lane-{lane}" if attempt == 1 else f"lane-{lane}-attempt-{attempt}"
        options: AbstractContextManager[Any] = nullcontext()
        if layout.on_ray:
            from prefect_ray.context import remote_options

            options = remote_options(**ray_options)
        with options:
            return runner.submit(
                lane_task.with_options(task_run_name=name), {**params, "shards": groups[lane], "lane": lane}
            )

    return submit


def _lane_row(report: LaneReport) -> dict[str, Any]:
    """A compact, JSON-friendly account of one finished lane."""
    return {
        "lane": report.lane,
        "generated": [r.shard_id for r in report.results if not r.skipped],
        "already_committed": list(report.already_committed),
        "devices": list(report.devices),
        "gpus": list(report.gpus),
        "held_from": report.held_from,
        "held_until": report.held_until,
        "node_id": report.node_id,
        "node_ip": report.node_ip,
        "attempt": report.attempt,
    }

"""The `batch_inference` flow: plan shards, run engine lanes, summarize."""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, wait

from flows.dealing import deal_shards
from flows.lanes import LaneReport, run_lane
from flows.reporting import ShardProgress, publish_summary, run_metrics
from flows.runners import make_task_runner, ray_cluster_gpus, visible_gpus
from flows.slots import DEFAULT_LIMIT
from pipeline import JobSpec, ShardInfo, describe_shards, finalize, load_job, plan_shards, prepare_output


class ShardsFailed(RuntimeError):
    """Some shards could not be committed after all lane retries."""


@task(name="plan-shards", persist_result=False, cache_policy=NO_CACHE)
def plan_job(
    input: str,
    output: str,
    model: str,
    job: str | dict[str, Any] | None,
    new_run: bool,
    overrides: dict[str, Any],
) -> tuple[JobSpec, list[ShardInfo]]:
    """Validate the job, check or write the output fingerprint, and describe every shard."""
    logger = get_run_logger()
    spec = load_job(input, output, model, job, **overrides)
    prepare_output(spec, new_run=new_run)
    infos = describe_shards(spec, plan_shards(spec))
    logger.info(
        "planned %d shards, %d rows, ~%d tokens",
        len(infos),
        sum(i.shard.num_rows for i in infos),
        sum(i.est_tokens for i in infos),
    )
    return spec, infos


@task(name="summarize-run", persist_result=False, cache_policy=NO_CACHE)
def summarize_run(spec: JobSpec, reports: list[LaneReport], wall_s: float, output: str) -> dict[str, Any]:
    """Write the manifest (totals from the commit markers; `complete` says whether every shard is
    committed) and publish the summary table artifact."""
    logger = get_run_logger()
    metrics = run_metrics(finalize(spec).as_dict(), reports, wall_s)
    publish_summary(metrics, output)
    logger.info("run summary: %s", metrics)
    return metrics


@flow(name="batch-inference", persist_result=False)
def batch_inference(
    input: str,
    output: str,
    model: str,
    job: str | dict[str, Any] | None = None,
    storage_options: dict[str, Any] | None = None,
    shard_rows: int | None = None,
    new_run: bool = False,
    overrides: dict[str, Any] | None = None,
    lanes: int | None = None,
    gpus_per_lane: int | None = None,
    ray_address: str | None = None,
    lane_retries: int = 2,
    retry_delay_s: float = 10.0,
    lane_timeout_s: float | None = None,
    concurrency_limit: str | None = DEFAULT_LIMIT,
    progress_poll_s: float = 2.0,
) -> dict[str, Any]:
    """Run an offline batch-inference job (the same job `prefixflow run` runs) as a Prefect flow.

    Shards are dealt to `lanes` engine lanes by prefix affinity; each lane loads its engine once
    and commits its shards one after another. Lanes run on a local thread pool (default: one lane
    per visible GPU, one on CPU) or, with `ray_address`, as Ray tasks with `gpus_per_lane` GPUs
    each (default: one lane per GPU in the cluster). Lanes retry `lane_retries` times with
    backoff; a retry skips committed shards. Each lane holds `gpus_per_lane` slots (1 on CPU) of
    the global concurrency limit `concurrency_limit` while its engine is loaded. Shards that
    still fail leave the flow Failed (after the summary), naming each uncommitted shard.
    """
    logger = get_run_logger()
    started = time.time()
    extra = dict(overrides or {})
    if storage_options is not None:
        extra["storage_options"] = storage_options
    if shard_rows is not None:
        extra["shard_rows"] = shard_rows
    spec, infos = plan_job(input, output, model, job, new_run, extra)

    local_gpus = 0 if ray_address else visible_gpus()
    with make_task_runner(ray_address, lanes or max(1, local_gpus)) as runner:
        if ray_address:
            cluster_gpus = ray_cluster_gpus()
            gpus = (1 if cluster_gpus else 0) if gpus_per_lane is None else gpus_per_lane
            n_lanes = lanes or max(1, cluster_gpus // max(1, gpus))
        else:
            gpus = (1 if local_gpus else 0) if gpus_per_lane is None else gpus_per_lane
            n_lanes = lanes or max(1, local_gpus // max(1, gpus))
        groups = [[info.shard for info in group] for group in deal_shards(infos, n_lanes)]
        logger.info(
            "%d shards on %d lanes (%s, %d GPU(s) per lane)",
            len(infos),
            len(groups),
            "ray" if ray_address else "threads",
            gpus,
        )
        progress = ShardProgress(spec, groups, output)
        lane_task = run_lane.with_options(
            retries=lane_retries,
            retry_delay_seconds=[retry_delay_s * 2**i for i in range(max(1, lane_retries))],
            timeout_seconds=lane_timeout_s,
        )
        pin = not ray_address and local_gpus > 0 and gpus > 0
        futures = _submit_lanes(
            runner, lane_task, spec, groups, concurrency_limit, gpus, bool(ray_address), pin
        )
        _wait_with_progress(futures, progress, progress_poll_s)
        reports, lane_errors = _collect(futures)
    for message in lane_errors:
        logger.error(message)

    progress.finish()
    failed = progress.uncommitted()
    metrics = summarize_run(spec, reports, time.time() - started, output)
    if failed:
        raise ShardsFailed(
            f"{len(failed)} of {progress.total} shards not committed after {lane_retries} "
            f"retries: {', '.join(failed)}. Lane errors: {' | '.join(lane_errors)}. "
            "Re-run the flow with the same output to resume; committed shards are kept."
        )
    return {**metrics, "lanes": [_lane_row(report) for report in reports]}


def _lane_row(report: LaneReport) -> dict[str, Any]:
    """A compact, JSON-friendly account of one finished lane."""
    return {
        "lane": report.lane,
        "generated": [r.shard_id for r in report.results if not r.skipped],
        "already_committed": list(report.already_committed),
        "slots_held": report.slots_held,
        "held_from": report.held_from,
        "held_until": report.held_until,
    }


def _submit_lanes(
    runner: Any,
    lane_task: Any,
    spec: JobSpec,
    groups: list[list[Any]],
    limit: str | None,
    gpus: int,
    on_ray: bool,
    pin: bool,
) -> list[PrefectFuture[LaneReport]]:
    """Submit one lane task per shard group: with `num_gpus` per Ray task when on Ray, pinned to
    GPU `i * gpus` when `pin` (local thread lanes on a multi-GPU host)."""
    options = nullcontext()
    if on_ray:
        from prefect_ray.context import remote_options

        options = remote_options(num_gpus=gpus) if gpus else nullcontext()
    with options:
        return [
            runner.submit(
                lane_task,
                {
                    "spec": spec,
                    "shards": group,
                    "lane": i,
                    "limit": limit,
                    "occupy": max(1, gpus),
                    "gpu_index": i * gpus if pin else None,
                },
            )
            for i, group in enumerate(groups)
        ]


def _wait_with_progress(futures: list[PrefectFuture[Any]], progress: ShardProgress, poll_s: float) -> None:
    """Block until every lane finishes, polling shard commits for the progress artifact."""
    pending = list(futures)
    while pending:
        pending = list(wait(pending, timeout=poll_s).not_done)
        progress.poll()


def _collect(futures: list[PrefectFuture[LaneReport]]) -> tuple[list[LaneReport], list[str]]:
    """Split lane outcomes into reports of completed lanes and messages of failed ones."""
    reports: list[LaneReport] = []
    errors: list[str] = []
    for future in futures:
        outcome = future.result(raise_on_failure=False)
        if isinstance(outcome, LaneReport):
            reports.append(outcome)
        else:
            state = future.state
            errors.append(f"{state.name}: {state.message or outcome}")
    return reports, errors

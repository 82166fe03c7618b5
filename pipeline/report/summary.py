"""finalize and status: totals from the commit markers (the only source of truth for what is done)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.job.spec import JobSpec, parse_job_config
from prefixflow.pipeline.report.speculation import sum_speculation
from prefixflow.pipeline.report.throughput_report import usage, write_charts
from prefixflow.pipeline.report.throughput_series import load_series, summary_of
from prefixflow.pipeline.run import commit as commits
from prefixflow.pipeline.run import lease
from prefixflow.pipeline.run.layout import Layout
from prefixflow.pipeline.run.planning import plan_shards
from prefixflow.pipeline.run.record import (
    RunRecord,
    current_run,
    foreign_files,
    output_layout,
    read_run_record,
    sweep,
)
from prefixflow.pipeline.storage.store import Store
from prefixflow.pipeline.tasks.label.batch import read_prior
from prefixflow.pipeline.tasks.label.charts import write_label_charts
from prefixflow.pipeline.tasks.label.quality import merge_quality, quality_report
from prefixflow.pipeline.tasks.label.watch import collapse_warning


@dataclass(frozen=True)
class RunSummary:
    """A run's totals. ``shards_total`` is None when the input could not be re-planned."""

    output: str
    data_glob: str
    shards_total: int | None
    shards_committed: int
    rows: int
    error_rows: int
    errors_by_class: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    elapsed_s: float = 0.0
    complete: bool = False
    shards_pending: list[str] = field(default_factory=list)
    shards_in_progress: list[str] = field(default_factory=list)
    run_id: str = ""
    foreign_files: list[str] = field(default_factory=list)  # in data/ but written by no run (status only)
    replaced_runs: list[str] = field(default_factory=list)  # data/ folders of replaced runs, not yet removed
    label_counts: dict[str, int] = field(default_factory=dict)  # label jobs: committed rows per label
    label_warning: str | None = None  # label_watch.collapse_warning over every committed labeled row
    device_seconds: float = 0.0  # every lane attempt's devices x shard-loop time (throughput_series)
    preemptions: int = 0  # engine preemptions while the committed shards generated
    # speculative decoding per method: proposed, accepted, runs, acceptance_rate, mean_accepted_length
    speculation: dict[str, dict[str, float]] = field(default_factory=dict)
    predicted_vs_measured: list[dict[str, Any]] = field(default_factory=list)  # advisor/compare.py rows
    label_counts_raw: dict[str, int] = field(default_factory=dict)  # score mode: rows per label before calibration
    label_calibration: dict[str, Any] = field(default_factory=dict)  # batch calibration's estimate (label_batch.py)
    label_quality: dict[str, Any] = field(default_factory=dict)  # with label.gold_column (label_quality.py)
    shards_unpublished: list[str] = field(default_factory=list)  # committed, not (wholly) in data/ yet
    shards_lost: list[str] = field(default_factory=list)  # committed, a part deleted: generated again next run
    orphan_parts: list[str] = field(default_factory=list)  # own parts no marker lists (a deleted marker)
    shards_unplanned: list[str] = field(default_factory=list)  # markers of shards not in the plan (never count)
    rows_published: int | None = None  # rows of committed shards wholly in data/ (None: not checked)

    @property
    def tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(tokens_per_s=self.tokens_per_s, output_tokens_per_s=self.output_tokens_per_s,
                 prefix_hit_rate=self.prefix_hit_rate)  # fmt: skip
        return d


def summarize_layout(
    layout: Layout, output: str, planned: list[str] | None, markers: list[commits.CommitMarker],
    num_labels: int = 0, foreign: list[str] | None = None, replaced: list[str] | None = None,
    data: DataState | None = None, label_names: tuple[str, ...] = (),
) -> RunSummary:  # fmt: skip
    """Totals of ``layout``'s run from its ``markers`` (only those of planned shards count, when the plan
    is known); ``num_labels`` (how many labels a label job lists) enables the label-collapse check (over
    the calibrated labels), ``label_names`` (the job's, in order) the label-quality report.
    ``data`` (what data/ holds) lets the summary tell committed from published: without it every
    committed shard is taken as published (finalize, which has just published them)."""
    if planned is not None:
        wanted = set(planned)
        unplanned = sorted(m.shard_id for m in markers if m.shard_id not in wanted)
        markers = [m for m in markers if m.shard_id in wanted]
    else:
        unplanned = []
    done = {m.shard_id for m in markers}
    classes: dict[str, int] = {}
    labels: dict[str, int] = {}
    for m in markers:
        for k, v in m.errors_by_class.items():
            classes[k] = classes.get(k, 0) + v
        for k, v in m.label_counts.items():
            labels[k] = labels.get(k, 0) + v
    staged = set(layout.store.list_dir(layout.staging()))
    pending = [s for s in planned if s not in done] if planned is not None else []
    unpublished = data.unpublished(markers) if data is not None else []
    lost = data.lost(markers) if data is not None else []
    orphans = data.orphans if data is not None else []
    return RunSummary(
        output=output,
        data_glob=layout.data_glob(),
        shards_total=len(planned) if planned is not None else None,
        shards_committed=len(markers),
        rows=sum(m.rows for m in markers),
        error_rows=sum(m.error_rows for m in markers),
        errors_by_class=dict(sorted(classes.items())),
        prompt_tokens=sum(m.prompt_tokens for m in markers),
        cached_tokens=sum(m.cached_tokens for m in markers),
        output_tokens=sum(m.output_tokens for m in markers),
        elapsed_s=sum(m.elapsed_s for m in markers),
        complete=planned is not None and not pending and not unpublished and not orphans,
        shards_pending=pending,
        shards_in_progress=sorted(staged - done),
        run_id=layout.run_id,
        foreign_files=foreign or [],
        replaced_runs=replaced or [],
        label_counts=dict(sorted(labels.items())),
        label_warning=collapse_warning(labels, num_labels, "the committed labeled rows"),
        device_seconds=round(sum(s.device_seconds for s in load_series(layout)), 3),
        preemptions=sum(m.preemptions for m in markers),
        speculation=sum_speculation([m.speculation for m in markers]),
        shards_unpublished=unpublished,
        shards_lost=lost,
        orphan_parts=orphans,
        shards_unplanned=unplanned,
        rows_published=sum(m.rows for m in markers if m.shard_id not in set(unpublished)),
        **_label_report(layout, markers, label_names),
    )


def _label_report(layout: Layout, markers: list[commits.CommitMarker], labels: tuple[str, ...]) -> dict[str, Any]:
    if not labels:
        return {}
    merged = merge_quality([m.label_quality for m in markers])
    prior = read_prior(layout)
    return {"label_counts_raw": merged.get("raw_counts", {}), "label_quality": quality_report(merged, labels),
            "label_calibration": prior.summary() if prior is not None else {}}  # fmt: skip


def listed_labels(job: Mapping[str, Any]) -> int:
    """How many labels a job config (as the run record stores it) lists; 0 unless it is a label job."""
    return len(job_labels(job))


def job_labels(job: Mapping[str, Any]) -> tuple[str, ...]:
    """The labels a job config (as the run record stores it) lists; () unless it is a label job."""
    return tuple(job.get("label", {}).get("labels", ())) if job.get("task") == "label" else ()


_OWN_PART = re.compile(r"part-.+-\d{5}\.parquet")


@dataclass(frozen=True)
class DataState:
    """What the run's data/ folder holds beside its markers. ``files`` is listed before the markers: a
    part is published only after its marker exists, so a concurrent commit never looks unlisted."""

    layout: Layout
    files: frozenset[str]
    markers: list[commits.CommitMarker]
    orphans: list[str]  # our own part names in a shard folder no marker lists (its marker was deleted)
    foreign: list[str]  # anything else no marker lists: written by no run

    def unpublished(self, markers: list[commits.CommitMarker]) -> list[str]:
        """Shards committed but not (wholly) in data/: a kill between marker and publish."""
        return sorted(m.shard_id for m in markers if any(self.layout.path(p.data) not in self.files for p in m.parts))

    def lost(self, markers: list[commits.CommitMarker]) -> list[str]:
        """Unpublished shards whose missing parts are not staged either: the next run generates them again."""
        store, out = self.layout.store, []
        for m in markers:
            gone = [p for p in m.parts if self.layout.path(p.data) not in self.files]
            if any(not store.exists(self.layout.path(p.staged)) for p in gone):
                out.append(m.shard_id)
        return sorted(out)


def data_state(layout: Layout) -> DataState:
    files = layout.store.list_files(layout.data)
    markers = commits.list_markers(layout)
    listed = {layout.path(p.data) for m in markers for p in m.parts}
    orphans: list[str] = []
    foreign: list[str] = []
    for f in files:
        if f in listed:
            continue
        parts = layout.rel(f).split("/")[2:]  # data/<run>/<shard>/<name>
        (orphans if len(parts) == 2 and _OWN_PART.fullmatch(parts[1]) else foreign).append(layout.rel(f))
    return DataState(layout, frozenset(files), markers, orphans, foreign)


def finalize(spec: JobSpec) -> RunSummary:
    """Publish any committed part a crash left unpublished (and regenerate nothing: a shard whose part was
    deleted is uncommitted, so it shows as pending), drop markers of shards the plan no longer has, remove
    parts left by deleted markers and what replaced runs and finished attempts left, then write
    _manifest.json with the totals. Raises OutputStateError when data/ holds files no run wrote (readers
    would take their rows for results)."""
    with lease.hold(output_layout(spec)):
        layout, record = current_run(spec)
        sweep(output_layout(spec), record)
        planned = [s.shard_id for s in plan_shards(spec)]
        state = data_state(layout)
        if state.foreign:
            raise foreign_files(layout, state.foreign)
        wanted, markers = set(planned), []
        for marker in state.markers:
            if marker.shard_id not in wanted:  # not in the plan: never counts, and its rows leave data/
                commits.drop(layout, marker.shard_id)
            elif commits.repair(layout, marker):
                markers.append(marker)
        for orphan in state.orphans:
            layout.store.remove(layout.path(orphan))
        for marker in markers:  # leftovers of attempts that lost a commit race, or of a cleanup cut short
            layout.store.remove_tree(layout.staging(marker.shard_id), best_effort=True)
        job = spec.config.as_record()
        summary = summarize_layout(layout, spec.output, planned, markers, listed_labels(job),
                                   label_names=job_labels(job))  # fmt: skip
        summary = with_prediction(layout, summary)
        series = load_series(layout)
        charts = [layout.rel(p) for p in write_charts(layout, series)]
        charts += [layout.rel(p) for p in write_label_charts(layout, summary)]
        manifest = {**summary.as_dict(), "finalized_at": time.time(), "fingerprint": spec.fingerprint_hash(),
                    "usage": usage(summary.as_dict(), series), "throughput": summary_of(series), "charts": charts}  # fmt: skip
        layout.store.write_atomic(layout.manifest, json.dumps(manifest, indent=1, sort_keys=True).encode())
    return summary


def status(output: str, storage: StorageConfig | None = None) -> tuple[RunSummary, RunRecord]:
    """Where a run stands, from its output root alone (re-plans the input when it is reachable)."""
    storage = storage or StorageConfig()
    root = Layout(Store.open(output, storage))
    record = read_run_record(root)
    if record is None:
        raise JobConfigError(f"{output} holds no prefixflow run (no _prefixflow.json); check the path")
    layout = root.for_run(record.run_id)
    planned = None
    try:
        s = record.spec
        endpoint = storage.endpoint_url or s["job"]["storage"].get("endpoint_url")
        job = dict(s["job"], storage={"endpoint_url": endpoint, "options": storage.options})
        spec = JobSpec(s["input"], s["output"], s["model"], parse_job_config(job))
        planned = [sh.shard_id for sh in plan_shards(spec)]
    except Exception:
        planned = None
    state = data_state(layout)
    markers, foreign = state.markers, state.foreign
    folders = [n for n in root.store.list_dir(root.path("data")) if n != record.run_id]
    others = [f"data/{n}" for n in folders if n not in record.retired_runs]
    replaced = [f"data/{n}" for n in folders if n in record.retired_runs]
    recorded = record.spec.get("job", {})
    num_labels = listed_labels(recorded) if isinstance(recorded, dict) else 0
    labels = job_labels(recorded) if isinstance(recorded, dict) else ()
    summary = summarize_layout(layout, output, planned, markers, num_labels, others + foreign, replaced, state,
                               labels)  # fmt: skip
    return with_prediction(layout, summary), record


def with_prediction(layout: Layout, summary: RunSummary) -> RunSummary:
    """``summary`` with the advisor's prediction for this run set beside what it measured (when the run
    stored one; see pipeline/advisor/compare.py)."""
    from prefixflow.pipeline.advisor.compare import compare, read_prediction

    prediction = read_prediction(layout)
    if prediction is None:
        return summary
    return replace(summary, predicted_vs_measured=compare(prediction, summary.as_dict()))

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
from prefixflow.pipeline.report.label_charts import write_label_charts
from prefixflow.pipeline.report.throughput_report import usage, write_charts
from prefixflow.pipeline.run import commit as commits
from prefixflow.pipeline.run import lease
from prefixflow.pipeline.run.files import RunFiles
from prefixflow.pipeline.run.handle import Run
from prefixflow.pipeline.run.planning import plan_shards
from prefixflow.pipeline.run.record import RunRecord, foreign_files, read_run_record, sweep
from prefixflow.pipeline.run.speculation import sum_speculation
from prefixflow.pipeline.run.throughput_series import load_series, summary_of
from prefixflow.pipeline.storage.layout import Layout
from prefixflow.pipeline.storage.store import Store
from prefixflow.pipeline.tasks.label.batch import read_prior
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
    label_counts_raw: dict[str, int] = field(
        default_factory=dict
    )  # score mode: rows per label before calibration
    label_calibration: dict[str, Any] = field(
        default_factory=dict
    )  # batch calibration's estimate (label_batch.py)
    label_quality: dict[str, Any] = field(default_factory=dict)  # with label.gold_column (label_quality.py)
    shards_unpublished: list[str] = field(default_factory=list)  # committed, not (wholly) in data/ yet
    shards_lost: list[str] = field(
        default_factory=list
    )  # committed, a part deleted: generated again next run
    orphan_parts: list[str] = field(default_factory=list)  # own parts no marker lists (a deleted marker)
    shards_unplanned: list[str] = field(
        default_factory=list
    )  # markers of shards not in the plan (never count)
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
        d.update(
            tokens_per_s=self.tokens_per_s,
            output_tokens_per_s=self.output_tokens_per_s,
            prefix_hit_rate=self.prefix_hit_rate,
        )
        return d


def summarize_layout(
    layout: Layout,
    output: str,
    planned: list[str] | None,
    markers: list[commits.CommitMarker],
    num_labels: int = 0,
    foreign: list[str] | None = None,
    replaced: list[str] | None = None,
    data: DataState | None = None,
    label_names: tuple[str, ...] = (),
    files: RunFiles | None = None,
) -> RunSummary:
    """Totals of ``layout``'s run from its ``markers`` (only those of planned shards count, when the plan
    is known); ``num_labels`` (how many labels a label job lists) enables the label-collapse check (over
    the calibrated labels), ``label_names`` (the job's, in order) the label-quality report.
    ``data`` (what data/ holds) lets the summary tell committed from published: without it every
    committed shard is taken as published (finalize, which has just published them). ``files``: a
    listing of the run (which shards have staged parts), else the staging folder is listed here."""
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
    staged = set(files.staged) if files is not None else set(layout.store.list_dir(layout.staging()))
    if files is not None:  # publish: direct flushes into data/ before the marker
        staged |= {s for s, found in files.data.items() if any(layout.is_direct(f) for f in found)}
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


def _label_report(
    layout: Layout, markers: list[commits.CommitMarker], labels: tuple[str, ...]
) -> dict[str, Any]:
    if not labels:
        return {}
    merged = merge_quality([m.label_quality for m in markers])
    prior = read_prior(layout)
    return {
        "label_counts_raw": merged.get("raw_counts", {}),
        "label_quality": quality_report(merged, labels),
        "label_calibration": prior.summary() if prior is not None else {},
    }


def listed_labels(job: Mapping[str, Any]) -> int:
    """How many labels a job config (as the run record stores it) lists; 0 unless it is a label job."""
    return len(job_labels(job))


def job_labels(job: Mapping[str, Any]) -> tuple[str, ...]:
    """The labels a job config (as the run record stores it) lists; () unless it is a label job."""
    return tuple(job.get("label", {}).get("labels", ())) if job.get("task") == "label" else ()


_OWN_PART = re.compile(r"part-.+-\d{5,}\.parquet")  # part-<attempt>-N (copies) and part-direct-N (direct)


@dataclass(frozen=True)
class DataState:
    """What the run's data/ folder holds beside its markers, from one listing (``files``). The listing is
    taken before the markers are read: a copied part is published only after its marker exists, so a
    concurrent commit of it never looks unlisted. Direct parts (``publish: direct``) exist before their
    marker, so a shard being written right now shows its parts among the orphans until it commits."""

    layout: Layout
    files: RunFiles
    markers: list[commits.CommitMarker]
    orphans: list[str]  # our own part names in a shard folder no marker lists (its marker was deleted)
    foreign: list[str]  # anything else no marker lists: written by no run

    def unpublished(self, markers: list[commits.CommitMarker]) -> list[str]:
        """Shards committed but not (wholly) in data/: a kill between marker and publish."""
        return sorted(m.shard_id for m in markers if self._missing(m))

    def lost(self, markers: list[commits.CommitMarker]) -> list[str]:
        """Unpublished shards whose missing parts are not staged either: the next run generates them again."""
        staged = self.files.paths
        return sorted(
            m.shard_id
            for m in markers
            if any(self.layout.path(p.staged) not in staged for p in self._missing(m))
        )

    def _missing(self, marker: commits.CommitMarker) -> list[commits.MarkerPart]:
        have = self.files.data.get(marker.shard_id, frozenset())
        return [p for p in marker.parts if self.layout.path(p.data) not in have]


def data_state(layout: Layout, files: RunFiles, markers: list[commits.CommitMarker]) -> DataState:
    """``files`` (a listing of the run) against its ``markers``: orphan and foreign files in data/."""
    listed = {layout.path(p.data) for m in markers for p in m.parts}
    orphans: list[str] = []
    foreign: list[str] = [layout.rel(f) for f in files.other_data]
    for shard_files in files.data.values():
        for f in sorted(shard_files):
            if f in listed:
                continue
            parts = layout.rel(f).split("/")[2:]  # data/<run>/<shard>/<name>
            (orphans if len(parts) == 2 and _OWN_PART.fullmatch(parts[1]) else foreign).append(layout.rel(f))
    return DataState(layout, files, markers, sorted(orphans), sorted(foreign))


def _removable(layout: Layout, state: DataState, held: lease.OutputLease) -> tuple[list[str], list[str]]:
    """The orphans finalize removes, and the direct parts of uncommitted shards it moves back into staging
    (their rows are done work a later attempt keeps; data/ then holds committed rows only). While another
    process writes the output, no direct part of an uncommitted shard is touched (it may be that shard's
    attempt in progress, its marker next; a later finalize handles it). Asks the store about other
    writers only when there is such a part."""
    committed = {m.shard_id for m in state.markers}
    waiting = {
        o for o in state.orphans if layout.is_direct(layout.path(o)) and o.split("/")[2] not in committed
    }
    removed = [o for o in state.orphans if o not in waiting]
    if waiting and held.others():
        waiting = set()
    return removed, sorted(waiting)


def finalize(run: Run) -> RunSummary:
    """Publish any committed part a crash left unpublished (and regenerate nothing: a shard whose part was
    deleted is uncommitted, so it shows as pending), drop markers of shards the plan no longer has, remove
    parts left by deleted markers and what replaced runs and finished attempts left, move the direct parts
    of shards that stay uncommitted back into staging (kept for the next attempt), then write
    _manifest.json with the totals. Raises OutputStateError when data/ holds files no run wrote (readers
    would take their rows for results). Lists the output once (lanes elsewhere committed too); reads only
    the markers the Run does not hold yet."""
    spec, layout = run.spec, run.layout
    with lease.hold(run.root) as held:
        run.refresh()
        sweep(run.root, run.record, run.files.folders)
        planned = list(run.planned) if run.planned is not None else [s.shard_id for s in plan_shards(spec)]
        state = data_state(layout, run.files, run.markers())
        if state.foreign:
            raise foreign_files(layout, state.foreign)
        wanted, markers = set(planned), []
        for marker in state.markers:
            if marker.shard_id not in wanted:  # not in the plan: never counts, and its rows leave data/
                commits.drop(layout, marker.shard_id)
                run.dropped(marker.shard_id)
            elif commits.repair(layout, marker, run.present(marker.shard_id)):
                markers.append(marker)
            else:
                run.dropped(marker.shard_id)
        removed, withdrawn = _removable(layout, state, held)
        for orphan in removed:
            layout.store.remove(layout.path(orphan))
        for part in withdrawn:
            commits.withdraw(layout, part.split("/")[2], layout.path(part))
        # leftovers of attempts that lost a commit race, or of a cleanup cut short or batched
        done = {m.shard_id for m in markers}
        layout.store.remove_files([p for s in done for p in run.staged_parts(s)])
        if layout.store.is_local:
            for shard_id in sorted(done & set(run.files.staged)):
                layout.store.remove_tree(layout.staging(shard_id), best_effort=True)
        job = spec.config.as_record()
        summary = summarize_layout(
            layout,
            spec.output,
            planned,
            markers,
            listed_labels(job),
            label_names=job_labels(job),
            files=run.files,
        )
        summary = with_prediction(layout, summary, run.files)
        series = load_series(layout)
        charts = [layout.rel(p) for p in write_charts(layout, series)]
        charts += [layout.rel(p) for p in write_label_charts(layout, summary)]
        manifest = {
            **summary.as_dict(),
            "finalized_at": time.time(),
            "fingerprint": spec.fingerprint_hash(),
            "usage": usage(summary.as_dict(), series),
            "throughput": summary_of(series),
            "charts": charts,
        }
        layout.store.write_atomic(layout.manifest, json.dumps(manifest, indent=1, sort_keys=True).encode())
    return summary


def status(output: str, storage: StorageConfig | None = None) -> tuple[RunSummary, RunRecord]:
    """Where a run stands, from its output root alone (re-plans the input when it is reachable): one
    listing of the root, the record, and every marker once."""
    storage = storage or StorageConfig()
    root = Layout(Store.open(output, storage))
    listing = root.store.listing(root.store.root)
    record = read_run_record(root) if root.record in listing else None
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
    files = RunFiles.of(layout, listing)
    found = (commits.committed_marker(layout, shard_id) for shard_id in sorted(files.markers))
    state = data_state(layout, files, [m for m in found if m is not None])
    markers, foreign = state.markers, state.foreign
    folders = sorted(files.folders.get("data", frozenset()) - {record.run_id})
    others = [f"data/{n}" for n in folders if n not in record.retired_runs]
    replaced = [f"data/{n}" for n in folders if n in record.retired_runs]
    recorded = record.spec.get("job", {})
    num_labels = listed_labels(recorded) if isinstance(recorded, dict) else 0
    labels = job_labels(recorded) if isinstance(recorded, dict) else ()
    summary = summarize_layout(
        layout, output, planned, markers, num_labels, others + foreign, replaced, state, labels, files
    )
    return with_prediction(layout, summary, files), record


def with_prediction(layout: Layout, summary: RunSummary, files: RunFiles | None = None) -> RunSummary:
    """``summary`` with the advisor's prediction for this run set beside what it measured (when the run
    stored one; see pipeline/advisor/compare.py). ``files``: a listing that says whether there is one."""
    from prefixflow.pipeline.advisor.compare import compare, read_prediction

    if files is not None and layout.prediction not in files.paths:
        return summary
    prediction = read_prediction(layout)
    if prediction is None:
        return summary
    return replace(summary, predicted_vs_measured=compare(prediction, summary.as_dict()))

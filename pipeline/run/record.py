"""The output root's run record: which run owns OUTPUT, with which job fingerprint and output schema.

``prepare_output`` writes it (or checks it against the job) before any row is written. A --new-run
replaces it with a record under a new run id *first* and only then removes what the replaced run wrote,
so a kill at any point leaves a record that names the current run, and everything of the replaced run
is either gone or recognisably retired (its run id is in ``retired_runs``) and removed by the next
command. Nothing is deleted that a run record does not name as prefixflow's.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pyarrow as pa

from prefixflow.pipeline.errors import (
    FingerprintMismatch,
    InputChanged,
    JobConfigError,
    OutputNotPrepared,
    OutputStateError,
)
from prefixflow.pipeline.hooks import hook
from prefixflow.pipeline.job.spec import JobSpec
from prefixflow.pipeline.run import commit as commits
from prefixflow.pipeline.run import lease
from prefixflow.pipeline.run.duplicates import duplicate_index
from prefixflow.pipeline.run.files import RunFiles
from prefixflow.pipeline.run.planning import PLAN_VERSION, InputFacts, input_changes, read_input_facts
from prefixflow.pipeline.storage.errors import REACH_HINT
from prefixflow.pipeline.storage.layout import LEASES_DIR, PRE_RECORD, RECORD_FILE, RUN_SCOPED, Layout
from prefixflow.pipeline.storage.store import Store
from prefixflow.pipeline.tasks.output_schema import (
    kept_column_types,
    output_schema,
    schema_from_text,
    schema_to_text,
)

RECORD_VERSION = 3  # 3: run ids, run-scoped folders, the output schema


@dataclass(frozen=True)
class RunRecord:
    """``OUTPUT/_prefixflow.json``. Secrets are never in it (storage options are left out)."""

    run_id: str
    fingerprint_hash: str
    fingerprint: dict[str, Any]
    spec: dict[str, Any]
    output_schema: str  # Arrow IPC, base64 (output_schema.schema_to_text)
    created_at: float
    retired_runs: tuple[str, ...] = ()
    version: int = RECORD_VERSION
    columns: dict[str, str] = field(default_factory=dict)  # the output schema, readable
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # relpath -> sources.file_identity
    plan_version: int = 1  # planning.PLAN_VERSION it was planned with (records before packing: 1)

    @property
    def schema(self) -> pa.Schema:
        return schema_from_text(self.output_schema)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True, default=str).encode()


def new_run_id() -> str:
    """Sortable by start time and unique: 20250101T120000-3fa2b1c0."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def output_layout(spec: JobSpec) -> Layout:
    if not spec.output:
        raise JobConfigError("output: pass a local folder or an s3:// URL for the results")
    return Layout(Store.open(spec.output, spec.config.storage))


CLI_DRIVER = "prefixflow run"  # the driver lease of a `prefixflow run` (also an OpenAI Batch run's, whole)


@contextmanager
def hold_output(output: JobSpec | Layout, driver: str = "", ref: str = "") -> Iterator[list[lease.Lease]]:
    """Hold this process's lease on the job's output (or this output ``Layout``) for the block (see lease.py): a --new-run elsewhere is
    refused meanwhile. prepare_output, run_shard and finalize take it themselves; holding it around a
    whole run (as `prefixflow run` and each flow lane do) only saves renewing it per call.

    ``driver`` (the run's name; `prefixflow run`, the flow's process) makes it the run's driver lease: one run
    per output at a time, OutputBusy naming the other one otherwise. Yields the driver leases of runs that
    died without finishing (``ref`` says what each was to its orchestrator)."""
    layout = output if isinstance(output, Layout) else output_layout(output)
    with lease.hold(layout, driver, ref) as held:
        yield list(held.dead_drivers)


def read_run_record(layout: Layout) -> RunRecord | None:
    """The run record, None when there is none; OutputStateError when it cannot be used."""
    try:
        data = layout.store.read_bytes(layout.record)
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise storage_failure(layout, exc) from exc
    return parse_run_record(layout, data)


def parse_run_record(layout: Layout, blob: bytes) -> RunRecord:
    """The run record stored as ``blob``; OutputStateError when it cannot be used."""
    where = layout.record
    try:
        data = json.loads(blob)
    except ValueError as exc:
        raise OutputStateError(
            f"{where} is not a readable prefixflow run record ({exc}); prefixflow will not "
            "guess what in that folder is its own: move it away or write to another --output"
        ) from exc
    if isinstance(data, dict) and "run_id" not in data and "fingerprint_hash" in data:
        raise OutputStateError(
            f"{layout.store.root} holds a run of an older prefixflow (its record has no run id). Finish or "
            "read it with the version that wrote it, then move it away, or write to another --output"
        )
    try:
        data["retired_runs"] = tuple(data.get("retired_runs", ()))
        return RunRecord(**data)
    except (TypeError, AttributeError) as exc:
        raise OutputStateError(
            f"{where} is not a readable prefixflow run record ({exc}); move the folder "
            "away or write to another --output"
        ) from exc


def storage_failure(layout: Layout, exc: BaseException) -> OutputStateError:
    """One line for a store that cannot be reached or read (endpoint down, credentials refused)."""
    return OutputStateError(
        f"output {layout.store.url(layout.store.root)}: cannot be reached ({type(exc).__name__}: {exc}); {REACH_HINT}"
    )


def _diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    keys = sorted(set(old) | set(new))
    out = []
    for k in keys:
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, f"{prefix}{k}.")
        elif json.dumps(a, default=str) != json.dumps(b, default=str):
            out.append(f"{prefix}{k}: {a!r} -> {b!r}")
    return out


def check_fingerprint(spec: JobSpec, layout: Layout, record: RunRecord | None) -> RunRecord:
    """The run record, if it is this job's; raises OutputNotPrepared or FingerprintMismatch otherwise."""
    if record is None:
        raise OutputNotPrepared(f"{spec.output} has no run record; call prepare_output(spec) first")
    if record.fingerprint_hash != spec.fingerprint_hash():
        changes = _diff(record.fingerprint, json.loads(json.dumps(spec.fingerprint(), default=str)))
        raise FingerprintMismatch(
            f"{spec.output} holds a run of a different job (fingerprint {record.fingerprint_hash}, "
            f"this job {spec.fingerprint_hash()}). Changed: {'; '.join(changes[:8]) or 'unknown'}. "
            "Resume with the original settings, write to another --output, or pass --new-run "
            "(prepare_output(new_run=True)) to discard the old results."
        )
    return record


def _check_output_root(spec: JobSpec, layout: Layout) -> None:
    """Refuse an output root that cannot hold a run, with what to fix (before anything is written)."""
    fs, root = layout.store.fs, layout.store.root
    try:
        is_file = fs.info(root).get("type") == "file"
    except (FileNotFoundError, NotADirectoryError):
        is_file = False
    except Exception as exc:  # an unreachable endpoint, refused credentials: one line, no traceback
        raise storage_failure(layout, exc) from exc
    if is_file:
        raise OutputStateError(
            f"output {spec.output} is an existing file; --output must be a folder "
            "(new or from an earlier run of this job)"
        )
    if layout.store.is_local:
        parent = root
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise OutputStateError(
                f"output {spec.output}: {parent} is a file, so the folder cannot be created"
            )
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputStateError(f"output {spec.output}: {parent} is not writable; pick another --output")


def _fresh_record(spec: JobSpec, inputs: InputFacts) -> RunRecord:
    """This job's record under a new run id. Everything that can fail on a bad job (the model, kept
    columns of irreconcilable types) fails here, before anything is written."""
    fingerprint = json.loads(json.dumps(spec.fingerprint(), default=str))
    schema = output_schema(spec.config, spec.task, kept_column_types(spec.config, inputs.schemas))
    job = spec.config.as_record()
    job["storage"] = {"endpoint_url": spec.config.storage.endpoint_url, "options": {}}  # no secrets on disk
    return RunRecord(
        run_id=new_run_id(),
        fingerprint_hash=spec.fingerprint_hash(),
        fingerprint=fingerprint,
        spec={"input": spec.input, "output": spec.output, "model": spec.model, "job": job},
        output_schema=schema_to_text(schema),
        created_at=time.time(),
        columns={f.name: str(f.type) for f in schema},
        inputs=inputs.identities,
        plan_version=PLAN_VERSION,
    )


@dataclass(frozen=True)
class CheckedOutput:
    """What ``check_output`` found: the output root's layout, this job's fresh record, and the record
    already there (None on a new output)."""

    layout: Layout
    fresh: RunRecord
    existing: RunRecord | None = None


def check_output(spec: JobSpec, new_run: bool = False, inputs: InputFacts | None = None) -> CheckedOutput:
    """Everything prepare_output checks, without writing anything: the model, the columns, the output
    root, and an existing run of another job (unless ``new_run``). ``inputs``: the input's facts, when the
    caller read them already (``planning.read_input_facts``)."""
    layout = output_layout(spec)
    _check_output_root(spec, layout)
    fresh = _fresh_record(spec, inputs if inputs is not None else read_input_facts(spec))
    existing = read_run_record(layout)
    if existing is None:
        _refuse_foreign_root(spec, layout)
    elif existing.fingerprint_hash != fresh.fingerprint_hash and not new_run:
        check_fingerprint(spec, layout, existing)
    elif not new_run:
        check_inputs(spec, existing, fresh)
    return CheckedOutput(layout, fresh, existing)


def check_inputs(spec: JobSpec, existing: RunRecord, fresh: RunRecord) -> None:
    """Refuse to resume a run whose input files changed since it started (InputChanged, naming them):
    its committed shards hold rows of the old contents, so a resume would keep deleted rows, duplicate
    moved ones and lose new ones. A record written before input identities were recorded is not checked."""
    if not existing.inputs:
        return
    changes = input_changes(existing.inputs, fresh.inputs)
    if changes:
        shown = "; ".join(changes[:8]) + (f"; and {len(changes) - 8} more" if len(changes) > 8 else "")
        raise InputChanged(
            f"the input of run {existing.run_id} in {spec.output} changed since it started: {shown}. Its "
            "committed rows come from the old files, so resuming would mix old and new rows. Restore the "
            "input as it was to resume, pass --new-run to discard the results and start over, or write to "
            "another --output"
        )


def prepare_output(spec: JobSpec, new_run: bool = False) -> RunRecord:
    """``prepare``, for callers that need only the record."""
    return prepare(spec, new_run)[0]


def prepare(
    spec: JobSpec, new_run: bool = False, checked: CheckedOutput | None = None
) -> tuple[RunRecord, list[commits.CommitMarker]]:
    """Write this job's run record (or check the existing one), remove what replaced runs left, index
    duplicate ids; return the record.

    Fails fast, before anything is written, on a bad model or a column problem (JobConfigError) and on an
    output root that cannot hold a run (OutputStateError): a file, unwritable, unreachable, or holding
    files but no run record. A run of another job is refused (FingerprintMismatch) unless ``new_run``,
    which replaces it, and is itself refused (OutputBusy) while another process still writes the output.
    A run with the same fingerprint is resumed unless its input files changed (InputChanged); ``new_run``
    always starts over. A resume first publishes what a kill left committed but unpublished.
    Also returns the run's markers (read for that repair), so a Run opened next need not read them.
    ``checked``: what ``check_output(spec, new_run)`` returned moments ago (`prefixflow run` checks
    before loading the engine), so the input's schemas and identities are not planned a second time.
    """
    checked = checked if checked is not None else check_output(spec, new_run)
    layout, fresh = checked.layout, checked.fresh
    with lease.hold(layout) as held:
        record = read_run_record(layout) or _create(spec, layout, fresh)
        if record.run_id != fresh.run_id:  # an existing run: resume it, or (new_run) start over
            if not new_run:
                check_fingerprint(spec, layout, record)
                check_inputs(spec, record, fresh)
            else:
                with held.exclusive():
                    record = _replace(layout, fresh, record.run_id)
        sweep(layout, record)
        if not held.others():  # alone on the output: temp files left are of killed or failed writes
            layout.store.remove_temp_files(skip=(LEASES_DIR,))
        run = layout.for_run(record.run_id)
        mark_in_progress(layout, record)
        markers = repair_published(run)
        if spec.config.id_column and not run.store.exists(run.duplicates):
            run.store.write_atomic(run.duplicates, duplicate_index(spec))
    return record, markers


def mark_in_progress(layout: Layout, record: RunRecord) -> None:
    """Replace ``_manifest.json`` (a finished run's totals) by one saying this run is in progress, so a
    reader never takes the manifest of a replaced or resumed run for the state of the output."""
    manifest = {
        "run_id": record.run_id,
        "complete": False,
        "state": "in progress",
        "started_at": time.time(),
        "note": "a run is writing this output; finalize rewrites this file with the totals",
    }
    layout.store.write_atomic(layout.manifest, json.dumps(manifest, indent=1, sort_keys=True).encode())


def repair_published(run: Layout) -> list[commits.CommitMarker]:
    """Publish every committed shard a kill left unpublished (publishing is part of committing), and
    uncommit those whose parts were deleted, so they are generated again (commit.repair). Returns the
    markers that stay. Two listings (data/ and staging) tell what is there, not a request per part."""
    markers = commits.list_markers(run)
    if not markers:
        return []
    files = RunFiles.of(run, {**run.store.listing(run.data), **run.store.listing(run.staging())})
    return [m for m in markers if commits.repair(run, m, files.present(m.shard_id))]


def _refuse_foreign_root(spec: JobSpec, layout: Layout) -> None:
    """A root without a run record must be empty (but for what a concurrent first start writes)."""
    try:
        names = layout.store.list_dir(layout.store.root)
    except Exception as exc:
        raise storage_failure(layout, exc) from exc
    foreign = [name for name in names if name not in PRE_RECORD]
    if foreign and RECORD_FILE not in names:  # with a record, a concurrent first start just won
        shown = ", ".join(foreign[:8]) + (" ..." if len(foreign) > 8 else "")
        raise OutputStateError(
            f"output {spec.output} is not empty ({shown}) and holds no prefixflow run record "
            "(_prefixflow.json). prefixflow writes only into an empty folder or one of its own runs, and "
            "never deletes what it did not write: pick a new --output, or empty this one"
        )


def _create(spec: JobSpec, layout: Layout, fresh: RunRecord) -> RunRecord:
    """The first record of an output root; refuses a root that already holds files of someone else."""
    _refuse_foreign_root(spec, layout)
    try:
        if layout.store.create_exclusive(layout.record, fresh.to_json()):
            return fresh
    except Exception as exc:
        raise storage_failure(layout, exc) from exc
    record = read_run_record(layout)  # a concurrent first start won
    if record is None:
        raise OutputStateError(f"{layout.record} vanished while being read; run the command again")
    return record


def _replace(layout: Layout, fresh: RunRecord, replacing: str) -> RunRecord:
    """--new-run, holding the output alone: the new record first (the old run stops counting at once),
    then ``sweep`` removes the old run's folders. Always starts over, also for the same job."""
    current = read_run_record(layout)
    if (
        current is not None
        and current.run_id != replacing
        and current.fingerprint_hash == fresh.fingerprint_hash
    ):
        return current  # another --new-run of this same job started over first
    retired = (*current.retired_runs, current.run_id) if current is not None else ()
    record = replace(fresh, retired_runs=retired)
    layout.store.write_atomic(layout.record, record.to_json())
    hook("new_run_recorded")
    return record


def sweep(layout: Layout, record: RunRecord, folders: Mapping[str, Collection[str]] | None = None) -> None:
    """Remove the folders of retired runs; refuse anything in data/ (or the other run-scoped folders)
    that no run record names, since readers of data/**/*.parquet would take its rows for results.
    ``folders``: the names below each run-scoped folder when a listing already tells (RunFiles)."""
    foreign: list[str] = []
    retired: list[str] = []
    for top in RUN_SCOPED:
        names = folders.get(top, ()) if folders is not None else layout.store.list_dir(layout.path(top))
        for name in sorted(names):
            if name == record.run_id:
                continue
            (retired if name in record.retired_runs else foreign).append(f"{top}/{name}")
    if foreign:
        raise foreign_files(layout, foreign)
    for rel in retired:
        layout.store.remove_tree(layout.path(rel), best_effort=True)


def foreign_files(layout: Layout, found: list[str]) -> OutputStateError:
    shown = ", ".join(found[:8]) + (" ..." if len(found) > 8 else "")
    return OutputStateError(
        f"output {layout.store.url(layout.store.root)} holds files no prefixflow run wrote: {shown}. Readers of "
        "OUTPUT/data/**/*.parquet would take their rows for results: move them out of the output folder and "
        "run the same command again (nothing committed is lost or recomputed)"
    )

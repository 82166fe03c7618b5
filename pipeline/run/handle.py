"""The Run handle: the state of one run on its output root, read once and kept current by its own writes.

``open_run`` lists the whole output root once (the run record, markers, staged parts, data/) and reads the
run record; every shard, commit, ``finalize``, ``status`` and summary then asks the Run instead of the
store. A commit updates it in place, so a shard costs the storage only what it must: read its input, write
its part(s), create its marker, and with ``publish: copy`` copy the part(s) into data/; parts written
directly into data/ (``publish: direct``) need no copy. What another process
may have changed since the listing is never trusted where it matters:

- a shard the Run thinks uncommitted may have been committed elsewhere meanwhile: the exclusive marker
  create still decides (the loser takes the winner's marker, as before), so staleness costs work, never rows;
- "is this still the output's run?" (a --new-run elsewhere) is answered by this process's lease: while it
  has been live without a gap since the record was read, no --new-run can have replaced the run (lease.py);
  otherwise the record is read again;
- ``refresh`` lists again (finalize, status and progress polls do, since lanes commit in other processes).
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefixflow.pipeline.errors import RunSuperseded
from prefixflow.pipeline.job.spec import JobSpec
from prefixflow.pipeline.run import commit as commits
from prefixflow.pipeline.run import lease
from prefixflow.pipeline.run.files import RunFiles
from prefixflow.pipeline.run.planning import check_plan_version
from prefixflow.pipeline.run.record import (
    CheckedOutput,
    RunRecord,
    check_fingerprint,
    check_output,
    output_layout,
    prepare,
    read_run_record,
)
from prefixflow.pipeline.storage.layout import Layout
from prefixflow.pipeline.storage.store import Store

RETIRE_BATCH = 100  # committed shards' staged parts are deleted in batches (one S3 request per 1,000 keys)


@dataclass
class Run:
    """One run of ``spec`` on its output root: its layout, record, fingerprint and what it has committed.

    Built by ``open_run``; shared by the threads of one process (its own lock), never sent to another
    process (each lane opens its own). ``planned``: the shard ids of the plan, when the caller planned."""

    spec: JobSpec
    layout: Layout
    record: RunRecord
    files: RunFiles
    planned: tuple[str, ...] | None = None
    verified_at: float = 0.0  # monotonic time the record was last read and named this run
    _markers: dict[str, commits.CommitMarker] = field(default_factory=dict, repr=False)
    _committed: set[str] = field(default_factory=set, repr=False)
    _written: dict[str, set[str]] = field(
        default_factory=dict, repr=False
    )  # shard -> parts staged/published since
    _retire: list[str] = field(default_factory=list, repr=False)  # staged parts of committed shards
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def __post_init__(self) -> None:
        self._committed |= self.files.markers

    @property
    def fingerprint(self) -> str:
        return self.record.fingerprint_hash

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def store(self) -> Store:
        return self.layout.store

    @property
    def root(self) -> Layout:
        """The layout of the output root without a run id (the run record, leases, the manifest)."""
        return Layout(self.layout.store)

    # -- what is committed --------------------------------------------------------------------------
    def committed_ids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._committed)

    def is_committed(self, shard_id: str) -> bool:
        with self._lock:
            return shard_id in self._committed

    def marker(self, shard_id: str) -> commits.CommitMarker | None:
        """The shard's marker if this run committed it (read once, then kept), else None."""
        with self._lock:
            if shard_id not in self._committed:
                return None
            known = self._markers.get(shard_id)
        if known is not None:
            return known
        marker = commits.committed_marker(self.layout, shard_id)
        with self._lock:
            if marker is None:
                self._committed.discard(shard_id)
            else:
                self._markers[shard_id] = marker
        return marker

    def markers(self) -> list[commits.CommitMarker]:
        """Every marker of this run, in shard order (those not yet known are read once)."""
        found = (self.marker(s) for s in sorted(self.committed_ids()))
        return [m for m in found if m is not None]

    def held_markers(self, shard_ids: Iterable[str]) -> list[commits.CommitMarker]:
        """The markers of these shards this Run already holds (its commits, what it read); reads none. A
        lane hands its own to the flow, whose finalize then need not read one marker per shard again."""
        with self._lock:
            return [m for m in (self._markers.get(s) for s in shard_ids) if m is not None]

    def known_markers(self, markers: list[commits.CommitMarker]) -> None:
        """Markers someone already read for this run (prepare_output): not read again."""
        with self._lock:
            for m in markers:
                if m.run_id == self.run_id and m.shard_id in self._committed:
                    self._markers[m.shard_id] = m

    # -- what the store holds -------------------------------------------------------------------------
    def staged_parts(self, shard_id: str) -> tuple[str, ...]:
        """The shard's staged parts: those listed, and those this Run staged since."""
        folder = self.layout.staging(shard_id) + "/"
        with self._lock:
            mine = [p for p in self._written.get(shard_id, ()) if p.startswith(folder)]
        listed = self.files.staged.get(shard_id, ())
        return listed + tuple(sorted(set(mine) - set(listed)))

    def present(self, shard_id: str) -> frozenset[str]:
        """Files known to exist for ``shard_id``: its staged parts and data/ files at the listing, plus
        what this Run wrote since (commit.publish trusts it and asks the store about anything else)."""
        with self._lock:
            return self.files.present(shard_id) | self._written.get(shard_id, set())

    def wrote(self, shard_id: str, *paths: str) -> None:
        with self._lock:
            self._written.setdefault(shard_id, set()).update(paths)

    def cached(self, key: str, load: Any) -> Any:
        """``load()`` once per Run (the id index, the label prior): values that do not change during a run."""
        with self._lock:
            if key not in self._cache:
                self._cache[key] = load()
            return self._cache[key]

    def id_index(self) -> pa.Table | None:
        """The run's id index (duplicates.py), read once; None when the job has no id column."""

        def load() -> pa.Table | None:
            if self.layout.duplicates not in self.files.paths and not self.store.exists(
                self.layout.duplicates
            ):
                return None
            return pq.read_table(io.BytesIO(self.store.read_bytes(self.layout.duplicates)))

        table: pa.Table | None = self.cached("id_index", load)
        return table

    # -- changes --------------------------------------------------------------------------------------
    def committed(self, marker: commits.CommitMarker) -> None:
        """A commit (ours, or the marker that won the race) and its publication: kept in place."""
        with self._lock:
            self._committed.add(marker.shard_id)
            self._markers[marker.shard_id] = marker
            listed = {self.layout.path(p.data) for p in marker.parts}
            written = self._written.setdefault(marker.shard_id, set())
            # our direct parts that lost the marker race: its publish removed them
            written -= {p for p in written if self.layout.is_direct(p) and p not in listed}
            written |= listed
            staging = self.layout.staging(marker.shard_id) + "/"
            ours = [self.layout.path(p.staged) for p in marker.parts]
            ours = [p for p in ours if p.startswith(staging)]  # a direct part is in data/: never retired
            self._retire += ours + [p for p in self.staged_parts(marker.shard_id) if p not in ours]
            due = len(self._retire) >= RETIRE_BATCH
        if due:
            self.retire_staging()

    def dropped(self, shard_id: str) -> None:
        with self._lock:
            self._committed.discard(shard_id)
            self._markers.pop(shard_id, None)

    def retire_staging(self) -> None:
        """Delete the staged parts of committed shards (published, so no longer needed) in one batch.
        Best effort: what stays is removed by finalize."""
        with self._lock:
            paths, self._retire = self._retire, []
        if not paths:  # (publish: direct stages nothing)
            return
        try:  # (the emptied folders of a local store go at finalize)
            self.store.remove_files(paths)
        except Exception:  # noqa: BLE001 - leftovers of committed shards are harmless
            pass

    def refresh(self) -> None:
        """List the output root again (other processes commit too); markers already read are kept."""
        files = RunFiles.of(self.layout, self.store.listing(self.store.root))
        with self._lock:
            self.files = files
            self._committed = set(files.markers)
            self._written = {}
            self._markers = {k: v for k, v in self._markers.items() if k in self._committed}

    def refresh_commits(self) -> None:
        """List the run's markers again (one listing of _commits/<run>/): what other lanes committed."""
        found = set(commits.committed_ids(self.layout))
        with self._lock:
            self._committed = found
            self._markers = {k: v for k, v in self._markers.items() if k in found}

    def ensure_current(self) -> None:
        """Raise RunSuperseded when a --new-run replaced this run. Free while this process's lease has
        been live since the record was last read (see module doc); otherwise one read of the record."""
        held = lease.held(self.root)
        if held is not None and held.covers(self.verified_at):
            return
        checked = time.monotonic()
        now = read_run_record(self.root)
        if now is None or now.run_id != self.run_id:
            raise RunSuperseded(
                f"output {self.store.url(self.store.root)} was taken over by another run "
                f"({now.run_id if now else 'record removed'}) while run {self.run_id} was writing it; this "
                "process stopped without committing more. Run the command again to resume the current run"
            )
        self.verified_at = checked


def open_run(
    spec: JobSpec,
    store: Store | None = None,
    shards: list[Any] | None = None,
    markers: list[commits.CommitMarker] | None = None,
    record: RunRecord | None = None,
    read_at: float | None = None,
) -> Run:
    """The current run of ``spec`` on its output: one listing of the root and one read of the record.

    Raises OutputNotPrepared (no record) or FingerprintMismatch (a run of another job), like every
    function that takes the Run. ``store``: the output's store (default: opened from the spec);
    ``shards``: the plan, so finalize need not plan again; ``markers``: ones already read; ``record``:
    this job's record as ``prepare`` wrote or checked it at ``read_at`` (``time.monotonic()``), not read
    again (``ensure_current`` re-reads it when this process's lease does not cover that moment)."""
    root = Layout(store) if store is not None else output_layout(spec)
    started = time.monotonic() if read_at is None else read_at
    listing = root.store.listing(root.store.root)
    if record is None:
        record = check_fingerprint(spec, root, read_run_record(root) if root.record in listing else None)
    layout = root.for_run(record.run_id)
    if shards is not None:
        check_plan_version(shards, record.plan_version, spec.config.output.shard_rows)
    planned = tuple(s.shard_id for s in shards) if shards is not None else None
    run = Run(spec, layout, record, RunFiles.of(layout, listing), planned, started)
    if markers:
        run.known_markers(markers)
    return run


def prepare_run(
    spec: JobSpec,
    new_run: bool = False,
    shards: list[Any] | None = None,
    checked: CheckedOutput | None = None,
) -> Run:
    """``prepare_output`` (write or check the run record, repair what a kill left), then ``open_run``
    with the record and the markers prepare read. Hold the output's lease around it and the shards
    (``hold_output``), so the Run's commits need no re-read of the record. ``checked``: as in ``prepare``."""
    started = time.monotonic()
    checked = checked if checked is not None else check_output(spec, new_run)
    record, markers = prepare(spec, new_run, checked)
    return open_run(
        spec, checked.layout.store, shards=shards, markers=markers, record=record, read_at=started
    )

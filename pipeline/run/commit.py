"""Staging, commit and publication of one shard's part files (the exactly-once core).

Order of events for a shard (all paths inside the run's own folders, see layout.py), ``publish: copy``:
parts are written (atomically) under _staging/<run>/<shard>/<attempt>/; when every row of the shard is in
some staged part, the marker _commits/<run>/<shard>.json is created exclusively (the commit point) listing
the chosen parts; then each listed part is copied to its data/<run>/ name; then staging is removed.

``publish: direct`` (the default): each part an attempt flushes is created exclusively at the shard's next
attempt-independent data/ name (``write_direct``, ``Layout.direct_part``), and the marker lists it as both
staged and published, so publishing has nothing to copy: 3 round trips for a shard of one part (read,
part, marker), and no copy per part for a shard of many. If a name exists (another attempt of the shard
is writing, or this attempt's listing was stale), the attempt stages its remaining parts, and its commit
asks the store what data/ holds, so its publish removes every file its marker does not list before
copying anything. A later attempt keeps an uncommitted shard's direct parts as done rows (``scan_kept``).

A crash at any point is repaired by re-running: before the marker nothing is visible but, in direct mode,
the shard's uncommitted direct parts, each row in at most one of them (kept by the next attempt, removed
by a commit that does not list them, moved back to staging by finalize); after it, ``publish`` is
idempotent. A marker counts only for the run whose id it carries.
"""

from __future__ import annotations

import io
import json
import logging
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow.parquet as pq

from prefixflow.pipeline.hooks import hook
from prefixflow.pipeline.storage.layout import Layout
from prefixflow.pipeline.tasks.label.quality import merge_quality, part_quality
from prefixflow.pipeline.tasks.label.watch import label_counts

COUNT_COLUMNS = ("prompt_tokens", "cached_tokens", "output_tokens")
LABEL_COLUMNS = ("label", "label_probs", "label_logprobs_raw", "label_gold")
_log = logging.getLogger("prefixflow")


@dataclass
class PartInfo:
    """One staged part: where it is, where it will be published, and what it holds."""

    staged: str
    data: str
    rows: int
    error_rows: int
    errors_by_class: dict[str, int]
    tokens: dict[str, int]
    row_keys: list[tuple[str, int]] = field(default_factory=list, repr=False)  # (source_file, row_index)
    label_counts: dict[str, int] = field(default_factory=dict)  # label jobs: rows per label
    label_quality: dict[str, Any] = field(default_factory=dict)  # label jobs: label_quality.part_quality

    def marker_part(self, layout: Layout) -> MarkerPart:
        return MarkerPart(layout.rel(self.staged), layout.rel(self.data), self.rows, self.error_rows)


def _summarize_part(
    data: bytes,
) -> tuple[list[tuple[str, int]], int, dict[str, int], dict[str, int], dict[str, int], dict[str, Any]]:
    part = pq.ParquetFile(io.BytesIO(data))
    names = part.schema_arrow.names
    has_label = "label" in names
    extra = [c for c in LABEL_COLUMNS if c in names] if has_label else []
    table = part.read(columns=["source_file", "row_index", "error_class", *COUNT_COLUMNS, *extra])
    keys = list(zip(table.column("source_file").to_pylist(), table.column("row_index").to_pylist()))
    classes: dict[str, int] = {}
    for c in table.column("error_class").to_pylist():
        if c is not None:
            classes[c] = classes.get(c, 0) + 1
    tokens = {c: int(sum(v or 0 for v in table.column(c).to_pylist())) for c in COUNT_COLUMNS}
    labels = label_counts(table.column("label").to_pylist()) if has_label else {}
    quality: dict[str, Any] = {}
    if has_label:
        job_labels = [f.name for f in part.schema_arrow.field("label_probs").type]
        cols = {c: table.column(c).to_pylist() for c in extra}
        quality = part_quality(
            job_labels,
            cols["label"],
            cols["label_probs"],
            cols.get("label_logprobs_raw"),
            cols.get("label_gold"),
        )
    return keys, sum(classes.values()), classes, tokens, labels, quality


def part_info(layout: Layout, shard_id: str, staged: str, data: bytes) -> PartInfo:
    attempt, name = staged.rsplit("/", 2)[-2:]
    n = int(name.removeprefix("part-").removesuffix(".parquet"))
    return _info(staged, layout.data_part(shard_id, attempt, n), data)


def _info(staged: str, published: str, data: bytes) -> PartInfo:
    keys, errors, classes, tokens, labels, quality = _summarize_part(data)
    return PartInfo(
        staged,
        published,
        len(keys),
        errors,
        classes,
        tokens,
        keys,
        labels,
        quality,
    )


def scan_kept(
    layout: Layout, shard_id: str, staged: tuple[str, ...] | None = None, direct: Collection[str] = ()
) -> list[PartInfo]:
    """Parts of earlier attempts that can be kept: the shard's uncommitted ``direct`` parts in data/
    (index order; kept first, as a reader sees them already), then its staged parts in attempt/part order,
    skipping any part that overlaps rows already covered (possible only if two attempts of one shard ran
    at once). Unreadable leftovers are ignored; their rows are simply generated again. ``staged``: the
    shard's staged part paths when known (a Run's listing), else listed here."""
    store = layout.store
    chosen: list[PartInfo] = []
    covered: set[tuple[str, int]] = set()
    in_data = sorted(set(direct), key=lambda p: layout.direct_index(p) or 0)
    from_data = set(in_data)
    in_staging = store.list_files(layout.staging(shard_id)) if staged is None else sorted(staged)
    for path in [*in_data, *(p for p in in_staging if p.endswith(".parquet"))]:
        try:
            data = store.read_bytes(path)
            info = _info(path, path, data) if path in from_data else part_info(layout, shard_id, path, data)
        except Exception:
            continue
        if covered.isdisjoint(info.row_keys):
            covered.update(info.row_keys)
            chosen.append(info)
    return chosen


def new_attempt_id() -> str:
    """A fresh attempt id (staging folder and data/ names of copied parts): time-ordered, never "direct"."""
    return f"{int(time.time() * 1000):013x}-{uuid.uuid4().hex[:8]}"


def write_part(layout: Layout, shard_id: str, attempt: str, n: int, data: bytes) -> PartInfo:
    path = layout.staged_part(shard_id, attempt, n)
    hook("flush_mid")
    layout.store.write_atomic(path, data)
    hook("flush_end")
    return part_info(layout, shard_id, path, data)


def write_direct(layout: Layout, shard_id: str, data: bytes, n: int = 0) -> PartInfo | None:
    """``publish: direct``: create the shard's part ``n`` at its data/ name (``Layout.direct_part``),
    exclusively, so one attempt's part is there; ``staged`` and ``data`` of the result are that one path.
    None when the name is taken (the caller stages this part and the rest instead)."""
    path = layout.direct_part(shard_id, n)
    hook("flush_mid")
    if not layout.store.create_exclusive(path, data):
        return None
    hook("flush_end")
    return _info(path, path, data)


@dataclass(frozen=True)
class MarkerPart:
    """One part a marker commits: its staged path and its data/ name (both relative to the output root;
    the same path for a part ``write_direct`` created in data/)."""

    staged: str
    data: str
    rows: int
    error_rows: int


@dataclass(frozen=True)
class CommitMarker:
    """The commit point of one shard: which staged parts hold its rows, and their totals.

    Stored as ``_commits/<run>/<shard>.json``; readers of the output trust nothing else."""

    shard_id: str
    run_id: str
    fingerprint: str
    attempt: str
    committed_at: float
    num_rows: int
    rows: int
    error_rows: int
    errors_by_class: dict[str, int]
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    elapsed_s: float
    parts: tuple[MarkerPart, ...]
    label_counts: dict[str, int] = field(default_factory=dict)  # label jobs; absent in older markers
    preemptions: int = 0  # the engine's preemptions while this attempt generated; absent in older markers
    # speculative decoding while this attempt generated, per method: proposed, accepted, runs (absent in older markers)
    speculation: dict[str, dict[str, int]] = field(default_factory=dict)
    label_quality: dict[str, Any] = field(
        default_factory=dict
    )  # label jobs (label_quality.py); not in older markers

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, blob: bytes | str) -> CommitMarker:
        data = json.loads(blob)
        parts = tuple(MarkerPart(**p) for p in data.pop("parts"))
        return cls(**data, parts=parts)


def build_marker(
    layout: Layout,
    shard_id: str,
    fingerprint: str,
    attempt: str,
    parts: list[PartInfo],
    elapsed_s: float,
    num_rows: int,
    preemptions: int = 0,
    speculation: dict[str, dict[str, int]] | None = None,
) -> CommitMarker:
    """The marker of ``layout``'s run for ``shard_id`` over ``parts``."""
    classes: dict[str, int] = {}
    labels: dict[str, int] = {}
    for p in parts:
        for k, v in p.errors_by_class.items():
            classes[k] = classes.get(k, 0) + v
        for k, v in p.label_counts.items():
            labels[k] = labels.get(k, 0) + v
    return CommitMarker(
        shard_id=shard_id,
        run_id=layout.run_id,
        fingerprint=fingerprint,
        attempt=attempt,
        committed_at=time.time(),
        num_rows=num_rows,
        rows=sum(p.rows for p in parts),
        error_rows=sum(p.error_rows for p in parts),
        errors_by_class=dict(sorted(classes.items())),
        prompt_tokens=sum(p.tokens["prompt_tokens"] for p in parts),
        cached_tokens=sum(p.tokens["cached_tokens"] for p in parts),
        output_tokens=sum(p.tokens["output_tokens"] for p in parts),
        elapsed_s=elapsed_s,
        parts=tuple(p.marker_part(layout) for p in parts),
        label_counts=dict(sorted(labels.items())),
        preemptions=preemptions,
        speculation=speculation or {},
        label_quality=merge_quality([p.label_quality for p in parts]),
    )


def commit(
    layout: Layout,
    marker: CommitMarker,
    before_publish: Callable[[], None] | None = None,
    present: Collection[str] | None = None,
    clean: bool = True,
) -> CommitMarker:
    """Create the marker exclusively; if another attempt won, its marker is the truth (and our own direct
    part, unless that marker lists it, leaves data/ as its publish begins). Then publish
    (after ``before_publish``, which raises to stop; ``present`` as in ``publish``) and, with ``clean``,
    remove the shard's staging (best effort: a concurrent attempt may still write there; ``finalize``
    removes what stays). A Run passes ``clean=False`` and deletes staged parts in batches instead."""
    hook("commit_begin")
    if not layout.store.create_exclusive(layout.marker(marker.shard_id), marker.to_json()):
        marker = read_marker(layout, marker.shard_id)
        present = None  # the winner's parts: ask the store
    hook("commit_marker")
    if before_publish is not None:
        before_publish()
    publish(layout, marker, present)
    hook("commit_end")
    if clean:
        layout.store.remove_tree(layout.staging(marker.shard_id), best_effort=True)
    return marker


def withdraw(layout: Layout, shard_id: str, path: str) -> None:
    """Move an uncommitted shard's direct part out of data/ into staging (a fresh attempt folder, so its
    rows stay done work for the next attempt): copy first, then remove, so a kill in between leaves the
    rows in both places, never in neither (the next attempt keeps one; the other goes at its commit)."""
    n = layout.direct_index(path) or 0
    layout.store.copy(path, layout.staged_part(shard_id, new_attempt_id(), n))
    layout.store.remove(path)


class PartLost(Exception):
    """A committed part is neither staged nor published: its rows are gone (someone deleted them)."""


def publish(layout: Layout, marker: CommitMarker, present: Collection[str] | None = None) -> None:
    """Copy every listed part to its data/ name, after removing any other file in the shard's data/
    folder (parts of an earlier commit of this shard whose marker was deleted, or another attempt's direct
    part: publishing beside them would show their rows twice). A part written in data/ directly (staged
    and data/ names equal) is only checked. Idempotent; safe to repeat after a crash. Raises PartLost
    when a part is neither staged nor published (``repair`` then regenerates the shard).

    ``present``: the shard's staged and data/ files known to exist (a Run's listing plus its own writes);
    then nothing known is asked again, and only what it lacks costs a request. None: ask the store."""
    store = layout.store
    listed = {layout.path(p.data) for p in marker.parts}
    folder = layout.data_shard(marker.shard_id) + "/"
    in_data = store.list_files(folder) if present is None else [p for p in present if p.startswith(folder)]
    for stale in in_data:
        if stale not in listed:
            store.remove(stale)
    known = set(in_data) if present is None else set(present)
    for i, part in enumerate(marker.parts):
        src, dst = layout.path(part.staged), layout.path(part.data)
        if i == 1:
            hook("publish_mid")
        if dst in known:
            continue
        if src in known and src != dst:
            try:
                store.copy(src, dst)
                continue
            except FileNotFoundError:  # gone since the listing: ask the store below
                pass
        if src == dst or not store.exists(src):  # (src == dst: written in data/ directly, nothing to copy)
            if store.exists(dst):  # a concurrent publisher copied it, then cleaned staging up
                continue
            raise PartLost(
                f"committed part {part.data} of shard {marker.shard_id} is missing from data/ "
                "and from staging"
            )
        store.copy(src, dst)


def repair(layout: Layout, marker: CommitMarker, present: Collection[str] | None = None) -> bool:
    """Make a committed shard visible: publish it; True when every part is in data/. When a part is lost
    (deleted by hand), the marker and the shard's data are removed and False comes back: the shard is
    then uncommitted and the run generates it again, instead of failing on every resume."""
    try:
        publish(layout, marker, present)
        return True
    except PartLost as exc:
        _log.warning("%s; shard %s will be generated again", exc, marker.shard_id)
        drop(layout, marker.shard_id)
        return False


def drop(layout: Layout, shard_id: str) -> None:
    """Uncommit a shard of ``layout``'s run: the marker first (from then on it does not count), then
    its data/ folder (a kill in between leaves parts that the next commit or finalize removes)."""
    layout.store.remove(layout.marker(shard_id))
    layout.store.remove_tree(layout.data_shard(shard_id))


def read_marker(layout: Layout, shard_id: str) -> CommitMarker:
    """The marker of ``shard_id`` in ``layout``'s run; ValueError if it is not one of this run's."""
    marker = CommitMarker.from_json(layout.store.read_bytes(layout.marker(shard_id)))
    if marker.run_id != layout.run_id or marker.shard_id != shard_id:
        raise ValueError(f"{layout.marker(shard_id)} belongs to run {marker.run_id}, not {layout.run_id}")
    return marker


def committed_marker(layout: Layout, shard_id: str) -> CommitMarker | None:
    """The shard's marker if this run committed it, else None (a marker of another run never counts)."""
    try:
        return read_marker(layout, shard_id)
    except (FileNotFoundError, ValueError, TypeError, KeyError):
        return None


def committed_ids(layout: Layout) -> frozenset[str]:
    """The shards ``layout``'s run has a marker for: one listing of its _commits/ folder, no marker read."""
    names = (p.rsplit("/", 1)[-1] for p in layout.store.list_files(layout.commits))
    return frozenset(n.removesuffix(".json") for n in names if n.endswith(".json"))


def list_markers(layout: Layout) -> list[CommitMarker]:
    """Every marker of ``layout``'s run (a file that is not one of its markers is skipped)."""
    out = []
    for path in layout.store.list_files(layout.commits):
        if path.endswith(".json"):
            shard_id = path.rsplit("/", 1)[-1].removesuffix(".json")
            marker = committed_marker(layout, shard_id)
            if marker is not None:
                out.append(marker)
    return out

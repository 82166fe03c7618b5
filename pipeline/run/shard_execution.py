"""run_shard: read a shard's rows, skip what is already flushed, generate the rest, flush, commit (with
``publish: direct`` every part goes straight to data/, see commit.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from prefixflow.pipeline.engine_access import Engine
from prefixflow.pipeline.errors import PipelineError, RowError, ShardError
from prefixflow.pipeline.hooks import hook
from prefixflow.pipeline.job.config import OutputConfig
from prefixflow.pipeline.run import commit as commits
from prefixflow.pipeline.run import lease
from prefixflow.pipeline.run.duplicates import load_derived_ids, load_duplicates
from prefixflow.pipeline.run.handle import Run
from prefixflow.pipeline.run.planning import plan_shards
from prefixflow.pipeline.run.speculation import SPECULATION_COUNTS
from prefixflow.pipeline.run.throughput_series import ThroughputRecorder, saver
from prefixflow.pipeline.storage.parquet_index import InputReader
from prefixflow.pipeline.storage.shards import Shard
from prefixflow.pipeline.storage.store import Store
from prefixflow.pipeline.tasks.base import RowWatch
from prefixflow.pipeline.tasks.inference import execute
from prefixflow.pipeline.tasks.label.labeling import CalibrationError
from prefixflow.pipeline.tasks.output_schema import base_record, encode_part, error_record
from prefixflow.pipeline.tasks.rows import Prepared, RowPreparer, derived_id


class ProgressSink(Protocol):
    """``advance`` once per row finished in this run; ``resumed`` for rows an earlier attempt already
    flushed or committed (they count as done but not toward any rate)."""

    def advance(
        self, rows: int, prompt_tokens: int = 0, cached_tokens: int = 0, output_tokens: int = 0
    ) -> None: ...

    def resumed(self, rows: int) -> None: ...


class Tee:
    """Several progress sinks as one (the display and the throughput recorder); ``warn`` goes to the
    first sink that has it."""

    def __init__(self, *sinks: Any) -> None:
        self.sinks = [s for s in sinks if s is not None]
        self.warn: Callable[[str], None] | None = next(
            (s.warn for s in self.sinks if callable(getattr(s, "warn", None))), None
        )

    def advance(
        self, rows: int, prompt_tokens: int = 0, cached_tokens: int = 0, output_tokens: int = 0
    ) -> None:
        for sink in self.sinks:
            sink.advance(rows, prompt_tokens, cached_tokens, output_tokens)

    def resumed(self, rows: int) -> None:
        for sink in self.sinks:
            sink.resumed(rows)


@dataclass(frozen=True)
class ShardResult:
    """Counts for one committed shard (from its marker, so a skipped shard reports the same totals)."""

    shard_id: str
    rows: int
    error_rows: int
    errors_by_class: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    elapsed_s: float = 0.0
    skipped: bool = False
    resumed_rows: int = 0  # rows found already flushed by an earlier attempt
    label_counts: dict[str, int] = field(default_factory=dict)  # label jobs: rows per label
    preemptions: int = 0  # the engine's, while the committing attempt generated

    @classmethod
    def from_marker(cls, marker: commits.CommitMarker, skipped: bool, resumed_rows: int = 0) -> ShardResult:
        return cls(
            marker.shard_id,
            marker.rows,
            marker.error_rows,
            dict(marker.errors_by_class),
            marker.prompt_tokens,
            marker.cached_tokens,
            marker.output_tokens,
            marker.elapsed_s,
            skipped,
            resumed_rows,
            dict(marker.label_counts),
            marker.preemptions,
        )


class _Flusher:
    """Buffers finished records; writes a closed part every ``flush_rows`` rows or ``flush_seconds``. With
    ``publish: direct`` each part is created at the shard's next direct name in data/ (``next_direct``),
    after checking that the run is still the output's (never write into a replaced run's data/); once a
    name is found taken (another attempt's file: ``taken``, so the commit asks the store what data/
    holds), this part and the rest are staged."""

    def __init__(
        self, run: Run, shard_id: str, schema: pa.Schema, cfg: OutputConfig, next_direct: int = 0
    ) -> None:
        self.run, self.shard_id, self.schema = run, shard_id, schema
        self.rows, self.seconds = cfg.flush_rows, cfg.flush_seconds
        self.direct = cfg.publish == "direct"
        self.next_direct = next_direct
        self.attempt = commits.new_attempt_id()
        self.buffer: list[dict[str, Any]] = []
        self.parts: list[commits.PartInfo] = []
        self.taken = False
        self.last = time.monotonic()

    def add(self, record: dict[str, Any]) -> None:
        self.buffer.append(record)
        if len(self.buffer) >= self.rows or time.monotonic() - self.last >= self.seconds:
            self.flush()

    def flush(self) -> None:
        self.last = time.monotonic()
        if not self.buffer:
            return
        hook("flush_begin")
        data = encode_part(self.buffer, self.schema)
        if self.direct and not self.taken:
            self.run.ensure_current()
            part = commits.write_direct(self.run.layout, self.shard_id, data, self.next_direct)
            if part is not None:
                self.next_direct += 1
                self.run.wrote(self.shard_id, part.data)
                self._done(part)
                return
            self.taken = True
        part = commits.write_part(self.run.layout, self.shard_id, self.attempt, len(self.parts), data)
        self.run.wrote(self.shard_id, part.staged)
        self._done(part)

    def _done(self, part: commits.PartInfo) -> None:
        self.parts.append(part)
        self.buffer = []


def run_shard(
    run: Run,
    shard: Shard,
    llm: Engine,
    progress: ProgressSink | None = None,
    *,
    label_watch: RowWatch | None = None,
) -> ShardResult:
    """Run one shard to commit. Skips a committed shard (re-publishing its parts if a crash interrupted
    that); inside an uncommitted one keeps earlier flushed parts and generates only the missing rows.
    Raises ShardError when the input file cannot be read, RunSuperseded when a --new-run replaced the
    output's run meanwhile (nothing of this shard is then published). ``label_watch`` sees every
    finished row. What the Run knows (markers, staged parts, data/) is not asked of the store again."""
    with lease.hold(run.root):
        return _run_shard(run, shard, llm, progress, label_watch)


def _run_shard(
    run: Run, shard: Shard, llm: Engine, progress: ProgressSink | None, label_watch: RowWatch | None
) -> ShardResult:
    start = time.perf_counter()
    spec, layout = run.spec, run.layout
    marker = run.marker(shard.shard_id)
    if marker is not None:
        if commits.repair(layout, marker, run.present(shard.shard_id)):
            if progress is not None:
                progress.resumed(marker.rows)
            return ShardResult.from_marker(marker, skipped=True)
        run.dropped(shard.shard_id)  # a lost part uncommitted it: generate it again
    if shard.error:
        raise ShardError(shard.shard_id, shard.error)
    present = run.present(shard.shard_id)
    direct = [p for p in present if layout.is_direct(p)]
    kept_parts = commits.scan_kept(layout, shard.shard_id, run.staged_parts(shard.shard_id), direct)
    done = {k for p in kept_parts for k in p.row_keys}
    if progress is not None and done:
        progress.resumed(len(done))
    rows = _read_shard(run, shard)
    cfg = spec.config
    next_direct = 1 + max((layout.direct_index(p) or 0 for p in direct), default=-1)
    schema = run.cached("schema", lambda: run.record.schema)
    flusher = _Flusher(run, shard.shard_id, schema, cfg.output, next_direct)
    task = spec.task
    relpaths = {p.relpath for p in shard.ranges()}
    prep = RowPreparer(cfg, llm, load_duplicates(run.id_index(), relpaths), task)
    renamed = load_derived_ids(run.id_index(), relpaths)  # null ids whose default derived id is a real id
    pending: list[Prepared] = []

    def emit(rec: dict[str, Any]) -> None:
        flusher.add(rec)
        if label_watch is not None:
            label_watch.observe(rec)
        if progress is not None:
            progress.advance(1, rec["prompt_tokens"], rec["cached_tokens"], rec["output_tokens"])

    for relpath, key, row in rows:
        if (relpath, key) in done:
            continue
        kept = {c: row.get(c) for c in cfg.keep_columns} | task.kept_values(cfg, row)
        derived = renamed.get((relpath, key)) or derived_id(relpath, key)
        base = base_record(key, derived, relpath, kept)
        try:
            base["id"] = prep.row_id(row, relpath, key)
            pending.append(prep.prepare(row, base, relpath, key))
        except RowError as err:
            emit(error_record(base, err.error_class, err.message))
    preempted = _preemptions(llm)
    speculated = speculation_counts(llm)
    state = None  # the run's shared state (a label job's stored prior, made now if this is the first shard)
    if pending:
        warn = getattr(label_watch, "warn", None)
        state = run.cached(
            "task_state",
            lambda: task.run_state(spec, layout, run.fingerprint, llm, lambda: plan_shards(spec), warn=warn),
        )
    try:
        for rec in execute(llm, prep, pending, cfg.output.flush_rows, state):
            emit(rec)
    except CalibrationError as exc:  # rows flushed so far stay staged; a rerun resumes after them
        raise ShardError(shard.shard_id, str(exc)) from exc
    covered = sum(p.rows for p in kept_parts + flusher.parts) + len(flusher.buffer)
    if covered != shard.num_rows:  # (checked before the last flush, which may go straight to data/)
        raise ShardError(shard.shard_id, f"internal: {covered} rows flushed for {shard.num_rows} input rows")
    flusher.flush()
    parts = kept_parts + flusher.parts
    marker = commits.build_marker(
        layout,
        shard.shard_id,
        run.fingerprint,
        flusher.attempt,
        parts,
        time.perf_counter() - start,
        shard.num_rows,
        _preemptions(llm) - preempted,
        speculation_delta(speculated, speculation_counts(llm)),
    )
    run.ensure_current()
    # another attempt's direct parts may be in data/ beyond what the Run knows: publish asks the store
    known = None if flusher.taken else run.present(shard.shard_id) | {p.staged for p in parts}
    marker = commits.commit(layout, marker, before_publish=run.ensure_current, present=known, clean=False)
    run.committed(marker)
    return ShardResult.from_marker(marker, skipped=False, resumed_rows=len(done))


def _read_shard(run: Run, shard: Shard) -> list[tuple[str, int, dict[str, Any]]]:
    """(file, row index, row) of every row the shard covers, file by file (one read per file; a small
    file, whose size the run record knows, in one request)."""
    spec = run.spec
    try:
        in_store = Store.open(spec.input, spec.config.storage)
    except Exception as exc:
        raise ShardError(
            shard.shard_id, f"cannot open input {spec.input!r}: {type(exc).__name__}: {exc}"
        ) from exc
    reader = run.cached("input_reader", InputReader)  # each file's footer parsed once per run
    columns = spec.input_columns()
    out: list[tuple[str, int, dict[str, Any]]] = []
    for piece in shard.ranges():
        try:
            size = run.record.inputs.get(piece.relpath, {}).get("size")
            table = reader.read(in_store, piece.path, piece.row_start, piece.row_end, columns, size)
            rows = table.to_pylist() if table.num_columns else [{} for _ in range(table.num_rows)]
        except Exception as exc:
            raise ShardError(
                shard.shard_id, f"cannot read input {piece.path!r}: {type(exc).__name__}: {exc}"
            ) from exc
        if len(rows) != piece.row_end - piece.row_start:
            raise ShardError(
                shard.shard_id,
                f"expected {piece.row_end - piece.row_start} rows in {piece.path!r}, read {len(rows)}; "
                "the file changed since planning",
            )
        out += [(piece.relpath, piece.row_start + i, row) for i, row in enumerate(rows)]
    return out


def speculation_counts(llm: Engine) -> dict[str, dict[str, int]]:
    """The engine's speculative-decoding counters so far, per method (empty without speculation)."""
    stats = getattr(llm, "stats", None)
    spec = getattr(stats(), "speculation", None) if callable(stats) else None
    if not isinstance(spec, dict):
        return {}
    return {m: {k: int(v.get(k, 0)) for k in SPECULATION_COUNTS} for m, v in spec.items()}


def speculation_delta(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    return {
        m: {k: v[k] - before.get(m, {}).get(k, 0) for k in SPECULATION_COUNTS}
        for m, v in after.items()
        if v["runs"] > before.get(m, {}).get("runs", 0)
    }


def _preemptions(llm: Engine) -> int:
    """The engine's preemption count so far (0 for an engine that keeps no stats)."""
    stats = getattr(llm, "stats", None)
    return int(getattr(stats(), "preemptions", 0)) if callable(stats) else 0


@dataclass(frozen=True)
class ShardOutcome:
    """One shard of ``run_shards``: its result, or the error that stopped it."""

    shard: Shard
    result: ShardResult | None = None
    error: ShardError | None = None


def run_shards(
    run: Run,
    shards: list[Shard],
    llm: Engine,
    progress: ProgressSink | None = None,
    warn: Callable[[str], None] | None = None,
    lane: str = "local",
    devices: int | None = None,
) -> Iterator[ShardOutcome]:
    """The shard loop of `prefixflow run` and of every flow lane: ``shards`` in order on one engine.

    A shard that fails (unreadable input, an unexpected error) is yielded with its error and the
    others still run; errors about the whole output (another run replaced it, the fingerprint no
    longer matches) are raised, since every further shard would fail the same way.
    ``warn`` receives warnings about the rows (label collapse); by default the progress display's
    ``warn`` when it has one, else the ``prefixflow`` logger. Throughput over time is recorded as
    ``lane``'s series beside the run record (``devices`` it holds: default the tensor-parallel size)."""
    spec = run.spec
    warn = warn or getattr(progress, "warn", None) or logging.getLogger("prefixflow").warning
    watch = spec.task.watch(spec.config, warn)
    engine = spec.config.engine
    held = (
        devices
        if devices is not None
        else int(engine.get("tensor_parallel_size") or 1) * int(engine.get("pipeline_parallel_size") or 1)
    )
    recorder = ThroughputRecorder(lane, save=saver(run.layout), devices=max(held, 1))
    detach = recorder.attach(llm)  # tokens per engine step, so the series shows decoding as it happens
    try:
        with lease.hold(run.root):
            yield from _shard_loop(run, shards, llm, Tee(progress, recorder), watch)
    finally:
        detach()
        recorder.flush()
        run.retire_staging()
    if watch is not None:
        watch.finish()


def _shard_loop(
    run: Run, shards: list[Shard], llm: Engine, progress: ProgressSink | None, watch: RowWatch | None
) -> Iterator[ShardOutcome]:
    for shard in shards:
        try:
            result = run_shard(run, shard, llm, progress, label_watch=watch)
        except ShardError as exc:
            yield ShardOutcome(shard, error=exc)
        except PipelineError:
            raise
        except Exception as exc:  # noqa: BLE001 - one bad shard must not stop the others
            logging.getLogger(__name__).debug("shard %s failed", shard.shard_id, exc_info=True)
            error = ShardError(shard.shard_id, f"{type(exc).__name__}: {exc}")
            error.__cause__ = exc
            yield ShardOutcome(shard, error=error)
        else:
            yield ShardOutcome(shard, result=result)

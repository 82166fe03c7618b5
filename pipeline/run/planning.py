"""Planning: split the input into shards (file + row-group-aligned row ranges) with stable ids.

A shard id depends only on the file's path relative to the input root and its row range, so the
same input and ``shard_rows`` always give the same ids: that is what lets a resumed run find its
committed shards.

Small files are packed (plan version 2): consecutive files with fewer rows than ``shard_rows`` share one
shard, up to ``shard_rows`` rows, so 2,000 one-row files make 2 shards of 1,000, not 2,000 shards of one
row each (0.37 s apiece of per-shard cost). A packed shard's id names its files by a digest of their
paths and row ranges. A run keeps the plan it started with: its record says which plan version it was
made with (records written before packing have none, and are planned one file per shard).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from prefixflow.pipeline.errors import InputError, JobConfigError, OutputStateError
from prefixflow.pipeline.job.spec import JobSpec
from prefixflow.pipeline.prompts.render import (
    as_text,
    conversation,
    plain_conversation,
    render_template,
    static_prefix,
)
from prefixflow.pipeline.storage.layout import RECORD_FILE
from prefixflow.pipeline.storage.parquet_index import DECODED_CACHE_BYTES, FileIndex, InputReader
from prefixflow.pipeline.storage.shards import Piece, Shard
from prefixflow.pipeline.storage.sources import InputFile, file_identity, list_inputs, parquet_file
from prefixflow.pipeline.storage.store import Store

CHARS_PER_TOKEN = 4  # rough text-to-token ratio for size estimates only
PREFIX_KEY_CHARS = 512  # how much of a shard's first rendered prompt its prefix key carries


PLAN_VERSION = 2  # 2: small files packed into shared shards; 1 (records without it): a file per shard


@dataclass(frozen=True)
class ShardInfo:
    """What a scheduler needs to place a shard: which prefix it shares and roughly how big it is."""

    shard: Shard
    prefix_key: str
    est_tokens: int


def _shard_id(relpath: str, start: int, end: int) -> str:
    stem = re.sub(r"[^A-Za-z0-9]+", "_", relpath.rsplit(".", 1)[0]).strip("_")[-40:] or "file"
    digest = hashlib.sha1(relpath.encode()).hexdigest()[:8]
    return f"{stem}-{digest}-{start:010d}-{end:010d}"


def _ranges(group_rows: list[int], target: int) -> list[tuple[int, int]]:
    """Pack consecutive row groups up to ``target`` rows; split a row group over twice the target."""
    out: list[tuple[int, int]] = []
    offset = 0
    start = 0
    for n in group_rows:
        if n > 2 * target:
            if offset > start:
                out.append((start, offset))
            pieces = -(-n // target)
            step = -(-n // pieces)
            out.extend((offset + i, min(offset + i + step, offset + n)) for i in range(0, n, step))
            offset += n
            start = offset
            continue
        if offset > start and offset - start + n > target:
            out.append((start, offset))
            start = offset
        offset += n
    if offset > start:
        out.append((start, offset))
    return out


def plan_file(spec: JobSpec, store: Store, f: InputFile) -> list[Shard]:
    try:
        meta = parquet_file(store, f.path).metadata
        group_rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    except Exception as exc:  # corrupt footer, permissions: the shard fails, the others run
        message = f"cannot read Parquet file {f.path!r}: {type(exc).__name__}: {exc}"
        return [Shard(_shard_id(f.relpath, 0, 0) + "-unreadable", f.path, 0, 0, 0, f.relpath, message)]
    ranges = _ranges(group_rows, spec.config.output.shard_rows)
    return [Shard(_shard_id(f.relpath, a, b), f.path, a, b, b - a, f.relpath) for a, b in ranges]


def _pack_id(pieces: list[Piece]) -> str:
    first = pieces[0].relpath
    stem = re.sub(r"[^A-Za-z0-9]+", "_", first.rsplit(".", 1)[0]).strip("_")[-40:] or "file"
    named = "\n".join(f"{p.relpath}\x00{p.row_start}\x00{p.row_end}" for p in pieces)
    return f"{stem}-{hashlib.sha1(named.encode()).hexdigest()[:12]}-pack{len(pieces):05d}"


def pack_small(shards: list[Shard], target: int) -> list[Shard]:
    """Consecutive one-shard files with fewer than ``target`` rows, packed into shards of up to ``target``
    rows (file order kept). A pack of one file stays that file's own shard, under its usual id, so
    input without small neighbours plans exactly as in plan version 1."""
    out: list[Shard] = []
    pack: list[Shard] = []

    def close() -> None:
        if len(pack) == 1:
            out.append(pack[0])
        elif pack:
            pieces = [p for s in pack for p in s.ranges()]
            rows = sum(s.num_rows for s in pack)
            out.append(
                Shard(_pack_id(pieces), pack[0].path, 0, rows, rows, pack[0].relpath, None, tuple(pieces))
            )
        pack.clear()

    by_file: dict[str, int] = {}
    for s in shards:
        by_file[s.path] = by_file.get(s.path, 0) + 1
    for s in shards:
        small = (
            not s.pieces
            and s.error is None
            and by_file[s.path] == 1
            and s.row_start == 0
            and 0 < s.num_rows < target
        )
        if not small:
            close()
            out.append(s)
            continue
        if sum(p.num_rows for p in pack) + s.num_rows > target:
            close()
        pack.append(s)
    close()
    return out


def plan_shards(spec: JobSpec, new_run: bool = False, version: int | None = None) -> list[Shard]:
    """All shards of the job's input, in file then row order. Reads only Parquet footers.

    ``version``: the plan version (default: the one the output's run of this job was planned with, or
    ``PLAN_VERSION`` for a new run; ``new_run`` starts one)."""
    store, files = list_inputs(spec.input, spec.config.storage)
    shards = [s for f in files for s in plan_file(spec, store, f)]
    if version is None:
        version = PLAN_VERSION if new_run else recorded_plan_version(spec)
    if version >= 2:
        shards = pack_small(shards, spec.config.output.shard_rows)
    if len({s.shard_id for s in shards}) != len(shards):
        raise InputError("two input files map to the same shard id; rename them so their paths differ")
    return shards


def recorded_plan_version(spec: JobSpec) -> int:
    """The plan version of the output's run of this job (1 for a record written before packing), or
    ``PLAN_VERSION`` when the output holds no run of this job (a new run, or one --new-run replaces)."""
    if not spec.output:
        return PLAN_VERSION
    out = Store.open(spec.output, spec.config.storage)
    try:
        record = json.loads(out.read_bytes(out.join(RECORD_FILE)))
    except (FileNotFoundError, NotADirectoryError, ValueError):  # none, or none of ours: prepare decides
        return PLAN_VERSION
    if not isinstance(record, dict) or record.get("fingerprint_hash") != spec.fingerprint_hash():
        return PLAN_VERSION
    return int(record.get("plan_version") or 1)


def describe_shards(spec: JobSpec, shards: list[Shard]) -> list[ShardInfo]:
    """Per shard: a prefix key and an estimate of prompt + output tokens from the Parquet column sizes.

    The key is the job's task and prompt head, then the first ``PREFIX_KEY_CHARS`` characters of the
    shard's first rendered prompt (system prompt + template over its first row; only that row is
    read), then file and row range as tie-breakers. Sorting by it puts shards whose prompts start
    alike next to each other, whatever file they are in, so cutting the sorted list into contiguous
    runs (as flows does) keeps shared prefixes on one engine. A shard whose first row cannot be
    read or rendered gets an empty prompt part (it sorts first); describing never fails over it."""
    cfg = spec.config
    shared = (cfg.system_prompt or "") + "\x00" + static_prefix(spec.task.template(cfg))
    head = f"{cfg.task}:{hashlib.sha1(shared.encode()).hexdigest()[:12]}"
    max_out = int(cfg.sampling.max_tokens or 64)
    if not shards:
        return []
    store, _ = list_inputs(spec.input, cfg.storage)
    reader = InputReader()  # each file's footer parsed once, not once per shard (O(shards^2) in one file)
    infos = []
    for shard in shards:
        text_bytes, sample = 0, ""
        if shard.error is None:
            try:
                text_bytes = _text_bytes(reader, store, shard, spec.prompt_columns())
            except Exception:
                text_bytes = 0
            sample = _first_prompt(spec, store, shard, reader)
        prompt_tokens = text_bytes // CHARS_PER_TOKEN + len(shared) // CHARS_PER_TOKEN * shard.num_rows
        key = f"{head}:{sample}\x00{shard.relpath}:{shard.row_start:012d}"
        infos.append(ShardInfo(shard, key, int(prompt_tokens + max_out * shard.num_rows)))
    return infos


def _first_prompt(spec: JobSpec, store: Store, shard: Shard, reader: InputReader) -> str:
    """The start of the shard's first prompt as the engine would get it (before any chat wrapping,
    which adds the same text to every prompt); "" when the row cannot be read or rendered."""
    try:
        row = _read_row(store, shard, spec.input_columns(), reader)
        return _render_prompt(spec, row)[:PREFIX_KEY_CHARS]
    except Exception:
        return ""


def _read_row(store: Store, shard: Shard, columns: list[str], reader: InputReader) -> dict[str, Any]:
    """Row ``shard.row_start`` of its file, only the needed columns: from its row group decoded once for
    all the shards inside it, or (a row group too big to keep decoded) streamed in small batches."""
    index = reader.index(store, shard.path)
    group = index.groups(shard.row_start, shard.row_start + 1)
    if not group:
        raise IndexError(f"row {shard.row_start} is not in {shard.path}")
    if index.uncompressed_bytes(group) <= DECODED_CACHE_BYTES:
        row: dict[str, Any] = reader.read(
            store, shard.path, shard.row_start, shard.row_start + 1, columns
        ).to_pylist()[0]
        return row
    pf = parquet_file(store, shard.path, index.size)
    present = [c for c in dict.fromkeys(columns) if c in index.names]
    skip = shard.row_start - index.starts[group.start]
    for batch in pf.iter_batches(batch_size=64, row_groups=[group.start], columns=present):
        if skip < batch.num_rows:
            row = batch.slice(skip, 1).to_pylist()[0]
            return row
        skip -= batch.num_rows
    raise IndexError(f"row {shard.row_start} is not in {shard.path}")


def _render_prompt(spec: JobSpec, row: dict[str, Any]) -> str:
    cfg = spec.config
    template = spec.task.template(cfg)
    ctx = dict(row)
    col = spec.task.document_column(cfg)
    if col is not None:
        ctx["document"] = as_text(row.get(col), f"column {col!r}")
    messages = row.get(cfg.messages_column) if cfg.messages_column else None
    if messages is not None or (cfg.messages_column and not cfg.prompt_column):
        text = plain_conversation(conversation(messages, f"column {cfg.messages_column!r}"))
    elif template is None:
        text = as_text(row.get(cfg.prompt_column or ""), f"column {cfg.prompt_column!r}")
    else:
        text = render_template(template, ctx, cfg.template_limits)
    return f"{cfg.system_prompt}\n\n{text}" if cfg.system_prompt else text


def _text_bytes(reader: InputReader, store: Store, shard: Shard, columns: set[str]) -> int:
    total = 0
    for piece in shard.ranges():  # (a packed shard: each of its files)
        total += _piece_text_bytes(reader.index(store, piece.path), piece, columns)
    return total


def _piece_text_bytes(index: FileIndex, piece: Piece, columns: set[str]) -> int:
    total = 0
    for i in index.groups(piece.row_start, piece.row_end):
        rg = index.metadata.row_group(i)
        lo, hi = max(index.starts[i], piece.row_start), min(index.starts[i + 1], piece.row_end)
        if hi > lo:
            size = sum(
                rg.column(j).total_uncompressed_size
                for j in range(rg.num_columns)
                if rg.column(j).path_in_schema in columns
            )
            total += size * (hi - lo) // max(rg.num_rows, 1)
    return total


def input_schemas(spec: JobSpec) -> list[tuple[str, pa.Schema]]:
    """(relative path, Arrow schema) of every readable input file, from the footers only."""
    store, files = list_inputs(spec.input, spec.config.storage)
    out = []
    for f in files:
        try:
            out.append((f.relpath, parquet_file(store, f.path).schema_arrow))
        except Exception:
            continue  # unreadable files fail their own shard
    return out


@dataclass(frozen=True)
class InputFacts:
    """What a run record fixes about the input: each file's schema (footers) and identity. Read once per
    command, before the output is checked, so checking and preparing the output never plan again."""

    schemas: list[tuple[str, pa.Schema]]
    identities: dict[str, dict[str, Any]]


def read_input_facts(spec: JobSpec) -> InputFacts:
    """The input's schemas and identities; JobConfigError when a named column is in no input file."""
    schemas = input_schemas(spec)
    check_input_columns(spec, schemas)
    return InputFacts(schemas, input_identities(spec))


def input_identities(spec: JobSpec) -> dict[str, dict[str, Any]]:
    """relative path -> ``sources.file_identity`` of every input file (what a resume must find unchanged)."""
    store, files = list_inputs(spec.input, spec.config.storage)
    return {f.relpath: file_identity(store, f.path) for f in files}


def input_changes(recorded: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]]) -> list[str]:
    """What differs between the input a run started on and the input now, one entry per file."""
    out = [
        f"{name} changed ({_what_changed(recorded[name], now[name])})"
        for name in sorted(set(recorded) & set(now))
        if recorded[name] != now[name]
    ]
    out += [f"{name} removed" for name in sorted(set(recorded) - set(now))]
    out += [f"{name} added" for name in sorted(set(now) - set(recorded))]
    return out


def _what_changed(old: dict[str, Any], new: dict[str, Any]) -> str:
    if old.get("size") != new.get("size"):
        return f"size {old.get('size')} -> {new.get('size')} bytes"
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return "same size, different " + "/".join(keys)


def check_input_columns(spec: JobSpec, schemas: list[tuple[str, pa.Schema]] | None = None) -> None:
    """Fail fast when a column the job names exists in none of the input files (a typo would otherwise
    turn every row into an error row). A column missing from only some files stays a per-row error."""
    present = {
        name for _, schema in (input_schemas(spec) if schemas is None else schemas) for name in schema.names
    }
    if not present:
        return
    cfg = spec.config
    wanted = {c: "template" for c in spec.prompt_columns()}
    if cfg.prompt_column:
        wanted[cfg.prompt_column] = "prompt_column"
    if cfg.messages_column:
        wanted[cfg.messages_column] = "messages_column"
    if cfg.id_column:
        wanted[cfg.id_column] = "id_column"
    wanted.update({c: f"sampling_columns.{k}" for k, c in cfg.sampling_columns.items()})
    wanted.update({c: "keep_columns" for c in cfg.keep_columns})
    wanted.update(spec.task.named_columns(cfg))
    missing = {c: key for c, key in wanted.items() if c not in present}
    if missing:
        named = ", ".join(f"{c!r} ({key})" for c, key in sorted(missing.items()))
        raise JobConfigError(
            f"{named}: not a column of any input file; the input has: {', '.join(sorted(present))}"
        )


def check_plan_version(shards: list[Shard], version: int, target: int) -> None:
    """Refuse shards planned under another plan version than the run's (``version``, from its record):
    committed shards would stop counting and their rows be generated again under other ids."""
    packed = any(s.pieces for s in shards)
    if (packed and version < 2) or (version >= 2 and pack_small(shards, target) != shards):
        raise OutputStateError(
            f"internal: the shards were planned {'with' if packed else 'without'} small files packed, "
            f"but the run was planned with plan version {version}; plan with plan_shards(spec, new_run=...) "
            "for the same run"
        )

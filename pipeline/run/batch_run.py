"""`prefixflow run --input batch.jsonl --output results.jsonl`: an OpenAI Batch file through the pipeline.

The run lives in a state folder beside the results, ``RESULTS.prefixflow/`` (local or S3):

    RESULTS.prefixflow/_batch_input/requests-<digest>.parquet   the requests as Parquet, named by the file's digest
    RESULTS.prefixflow/_prefixflow.json, _commits/, data/ ...   an ordinary run over that table

Every guarantee of an ordinary run carries over: shards commit exactly once and a rerun resumes.
``RESULTS`` itself is written in one piece (a rename locally, a single PUT on S3) only when every
shard is committed, so a reader never sees a partial or duplicated results file. A changed input
file has another digest, so its run cannot be mixed with the old one (``--new-run`` starts over).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq

from prefixflow.pipeline.errors import FingerprintMismatch, InputError, JobConfigError, OutputStateError
from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.job.spec import JobSpec, load_job
from prefixflow.pipeline.job.spec import _normalize as normalize_url
from prefixflow.pipeline.run.record import CLI_DRIVER, hold_output, output_layout, read_run_record
from prefixflow.pipeline.storage.layout import BATCH_INPUT_DIR, Layout
from prefixflow.pipeline.storage.store import Store
from prefixflow.pipeline.tasks.openai_batch import (
    BatchRequest,
    batch_job,
    looks_like_batch,
    parse_batch,
    requests_table,
)
from prefixflow.pipeline.tasks.openai_batch_output import results_jsonl

STATE_SUFFIX = ".prefixflow"
BATCH_SUFFIXES = (".jsonl", ".ndjson")
RESULT_COLUMNS = [
    "id",
    "output",
    "finish_reason",
    "error",
    "error_class",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "samples",
]


@dataclass(frozen=True)
class BatchJob:
    """A Batch file's job: the pipeline spec over the converted requests, and where results go."""

    spec: JobSpec
    results: str
    num_requests: int
    converted: str  # file name of the requests table under _batch_input/


def is_batch_input(url: str, storage: StorageConfig) -> bool:
    """A ``.jsonl``/``.ndjson`` file, or a single file whose first line is a Batch request object."""
    if url.rstrip("/").endswith(BATCH_SUFFIXES):
        return True
    try:
        store = Store.open(url, storage)
        if not store.fs.isfile(store.root):
            return False
        with store.fs.open(store.root, "rb") as f:
            return looks_like_batch(f.read(4096))
    except Exception:  # unreachable or odd URLs are left to the Parquet path, which explains them
        return False


def _read_input(url: str, storage: StorageConfig) -> bytes:
    try:
        store = Store.open(url, storage)
        return bytes(store.read_bytes(store.root))
    except FileNotFoundError as exc:
        raise InputError(f"input {url!r} does not exist") from exc
    except Exception as exc:
        raise InputError(
            f"cannot read input {url!r}: {type(exc).__name__}: {exc}; check the path, credentials "
            "(AWS_* environment, --storage-option) or --endpoint-url"
        ) from exc


def read_batch_file(url: str, storage: StorageConfig) -> list[BatchRequest]:
    """Parse a Batch file (InputError for a missing or malformed one)."""
    return parse_batch(_read_input(url, storage), url)


def prepare_batch(
    input: str,
    results: str,
    model: str,
    job: str | dict[str, Any] | None = None,
    new_run: bool = False,
    **overrides: Any,
) -> BatchJob:
    """Convert the Batch file (once per content) and build the job over it. Raises InputError for a
    malformed file, JobConfigError for a results path that is not a .jsonl file, and
    FingerprintMismatch when the state folder holds a run of another version of the file. Takes no
    lease: `prefixflow run` uses ``driving_batch``."""
    batch, requests = _plan_batch(input, results, model, job, **overrides)
    _convert(batch, requests, input, new_run)
    return batch


@contextmanager
def driving_batch(
    input: str,
    results: str,
    model: str,
    job: str | dict[str, Any] | None = None,
    new_run: bool = False,
    **overrides: Any,
) -> Iterator[BatchJob]:
    """``prepare_batch`` under the state folder's driver lease, held for the block: the conversion, the run,
    the cleanup of older conversions and the results file are one run's. A second run of the job into the
    same results is refused (OutputBusy, naming the running one) before it writes or deletes anything."""
    batch, requests = _plan_batch(input, results, model, job, **overrides)
    # refused before the lease, whose file would otherwise be the first thing the refused run writes
    _check_results_owner(batch.results, output_layout(batch.spec), batch.spec.config.storage, new_run)
    with hold_output(batch.spec, driver=CLI_DRIVER):
        _convert(batch, requests, input, new_run)
        yield batch


def _plan_batch(
    input: str, results: str, model: str, job: str | dict[str, Any] | None, **overrides: Any
) -> tuple[BatchJob, list[BatchRequest]]:
    """The job over the Batch file's requests, and the parsed requests; reads the file, writes nothing."""
    if not results.rstrip("/").endswith(BATCH_SUFFIXES):
        raise JobConfigError(
            f"--output {results!r}: OpenAI Batch results are a JSONL file; pass e.g. results.jsonl"
        )
    job_data = _job_dict(job)
    storage = load_job(input, "", model, job_data, **overrides).config.storage  # validates before any I/O
    data = _read_input(input, storage)
    requests = parse_batch(data, input)
    name = f"requests-{hashlib.sha256(data).hexdigest()[:16]}.parquet"
    state = results.rstrip("/") + STATE_SUFFIX
    spec = load_job(f"{state}/{BATCH_INPUT_DIR}/{name}", state, model, job_data, **overrides)
    return BatchJob(spec, normalize_url(results), len(requests), name), requests


def _convert(batch: BatchJob, requests: list[BatchRequest], input: str, new_run: bool) -> None:
    """Check who owns the results and the state folder, then write the requests table (once per content)."""
    spec = batch.spec
    layout = output_layout(spec)
    _check_results_owner(batch.results, layout, spec.config.storage, new_run)
    record = read_run_record(layout)
    if record is not None and record.spec["input"] != spec.input and not new_run:
        raise FingerprintMismatch(
            f"{input} has changed since the run in {spec.output} started (its content differs); "
            "rerun with the original file, pass --new-run to start over, or pick another --output"
        )
    converted = layout.path(BATCH_INPUT_DIR, batch.converted)
    if not layout.store.exists(converted):
        layout.store.write_atomic(converted, requests_table(requests))


def _job_dict(job: str | dict[str, Any] | None) -> dict[str, Any]:
    from prefixflow.pipeline.job.spec import _read_job

    return batch_job(_read_job(job))


def _check_results_owner(results: str, layout: Layout, storage: StorageConfig, new_run: bool) -> None:
    """Never replace a results file that another tool (or a deleted run) left, unless told to."""
    store = Store.open(results, storage)
    if store.fs.isdir(store.root):  # --new-run cannot help: the file could never be written there
        raise OutputStateError(
            f"--output {results} is a folder; OpenAI Batch results are one JSONL file: pass a "
            f"file path such as {results.rstrip('/')}/results.jsonl, or another name"
        )
    if store.exists(store.root) and not layout.store.exists(layout.record) and not new_run:
        raise OutputStateError(
            f"{results} exists but {layout.store.root} holds no prefixflow run that wrote it; "
            "pass --new-run to replace it, or pick another --output"
        )


def cleanup_inputs(batch: BatchJob) -> None:
    """Drop converted tables of earlier file versions (left after a --new-run)."""
    layout = output_layout(batch.spec)
    for path in layout.store.list_files(layout.path(BATCH_INPUT_DIR)):
        if path.rsplit("/", 1)[-1] != batch.converted:
            layout.store.remove_tree(path)


def write_results(batch: BatchJob) -> int:
    """Write RESULTS from the committed rows, every request exactly once, in input order; returns the
    number of lines. Call only when the run is complete."""
    spec = batch.spec
    layout = output_layout(spec)
    record = read_run_record(layout)
    if record is None:
        raise OutputStateError(f"{layout.store.root} holds no run record")
    store = layout.store
    requests = pq.read_table(
        io.BytesIO(store.read_bytes(layout.path(BATCH_INPUT_DIR, batch.converted))),
        columns=["custom_id", "line", "request_kind", "request_error"],
    ).to_pylist()
    records: dict[str, dict[str, Any]] = {}
    for path in store.list_files(layout.for_run(record.run_id).data):
        if path.endswith(".parquet"):
            for row in pq.read_table(io.BytesIO(store.read_bytes(path)), columns=RESULT_COLUMNS).to_pylist():
                if row["id"] in records:
                    raise OutputStateError(f"custom_id {row['id']!r} has two results in {layout.store.root}")
                records[row["id"]] = row
    missing = [r["custom_id"] for r in requests if r["custom_id"] not in records]
    if missing:
        raise OutputStateError(
            f"{len(missing)} requests have no committed result yet (first: {missing[0]!r})"
        )
    body = results_jsonl(requests, records, spec.model, record.fingerprint_hash, int(record.created_at))
    target = Store.open(batch.results, spec.config.storage)
    target.write_atomic(target.root, body)
    return len(requests)


def read_results(url: str, storage: StorageConfig | None = None) -> list[dict[str, Any]]:
    """The results file as parsed lines (for tests and for users checking a run)."""
    store = Store.open(url, storage or StorageConfig())
    return [json.loads(line) for line in store.read_bytes(store.root).decode("utf-8").splitlines() if line]

"""Where everything lives under the output root, in one place.

    OUTPUT/_prefixflow.json                          the run record: run id, job fingerprint, spec, output
                                                     schema, ids of the runs it replaced (retired runs)
    OUTPUT/_leases/<holder>.json                     one per live process writing OUTPUT (pipeline/run/lease.py)
    OUTPUT/_ids/<run>/duplicates.parquet             rows whose id repeats an earlier row's id
    OUTPUT/_staging/<run>/<shard>/<attempt>/part-N.parquet   flushed, not yet committed
    OUTPUT/_commits/<run>/<shard>.json               commit marker, created exclusively: the commit point
    OUTPUT/data/<run>/<shard>/part-<attempt>-N.parquet      published copies of committed parts (publish: copy,
                                                     and parts an attempt had to stage)
    OUTPUT/data/<run>/<shard>/part-direct-N.parquet  parts written straight into data/ (publish: direct)
    OUTPUT/_predictions/<run>/prediction.json        what the advisor predicted for the run (advisor/compare.py)
    OUTPUT/_calibration/<run>/label_prior.json       batch label calibration's estimate (label_batch.py)
    OUTPUT/_manifest.json                            totals, written by finalize
    OUTPUT/_batch_input/requests-<digest>.parquet    an OpenAI Batch run's requests (batch_run.py)
    OUTPUT/_metrics/<run>/throughput/<lane>-<attempt>.json   throughput over time per lane attempt
    OUTPUT/_throughput.svg (.png)                    tok/s over time of the current run, written by finalize

Everything a run writes sits below a folder named by its run id, so a marker, a staged part or a data file
of another run can never be taken for this run's, and a replaced run is removed folder by folder.
Readers glob ``OUTPUT/data/**/*.parquet``. data/ receives two kinds of file, and a shard's folder holds
at most one version of each row at a time, so every input row appears there at most once, and exactly
once after finalize:

- copies of staged parts listed in a marker of the current run, under names fixed by that marker, made
  only after the marker exists (``publish: copy``, and the parts a direct attempt had to stage);
- ``publish: direct``: each part an attempt flushes is created exclusively at the shard's next free
  attempt-independent name ``part-direct-N.parquet`` (N = 1 + the highest such N the attempt knows of)
  before the marker. An attempt that finds its name taken (another attempt of the shard is writing, or
  its listing was stale) stages the rest of its parts. So each name has one writer, and the writer of N
  knew every direct part below N and generated none of their rows: the direct parts of a shard never
  share a row. Until the marker exists they are uncommitted; a later attempt keeps them as done (a
  resume after a kill copies nothing); any commit of the shard removes those its marker does not list
  before publishing, and finalize moves them out of data/ into staging when the shard stays
  uncommitted. (One limit, for two attempts of one shard at once: docs/pipeline.md, "Publishing".)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from prefixflow.pipeline.storage.store import Store

RECORD_FILE = "_prefixflow.json"
DIRECT_ATTEMPT = "direct"  # data/ names of directly written parts (publish: direct): part-direct-N
_DIRECT_NAME = re.compile(rf"part-{DIRECT_ATTEMPT}-(\d{{5,}})\.parquet")
MANIFEST_FILE = "_manifest.json"
LEASES_DIR = "_leases"
DATA_DIR = "data"
BATCH_INPUT_DIR = "_batch_input"  # an OpenAI Batch run's converted requests (batch_run.py)
RUN_SCOPED = (
    DATA_DIR,
    "_commits",
    "_staging",
    "_ids",
    "_predictions",
    "_metrics",
    "_calibration",
)  # each holds one folder per run id
# Entries a root may hold before its run record exists: what a concurrent first start writes, and the
# requests table an OpenAI Batch run converts into its own state folder before its run starts.
PRE_RECORD = (RECORD_FILE, LEASES_DIR, BATCH_INPUT_DIR)


@dataclass(frozen=True)
class Layout:
    """Paths under an output root; ``run_id`` is set (``for_run``) once the run record is known."""

    store: Store
    run_id: str = ""

    def for_run(self, run_id: str) -> Layout:
        return replace(self, run_id=run_id)

    def path(self, *parts: str) -> str:
        return self.store.join(*parts)

    def _run(self, top: str, *parts: str) -> str:
        if not self.run_id:
            raise ValueError("internal: a run-scoped path needs Layout.for_run(run_id)")
        return self.path(top, self.run_id, *parts)

    @property
    def record(self) -> str:
        return self.path(RECORD_FILE)

    @property
    def manifest(self) -> str:
        return self.path(MANIFEST_FILE)

    @property
    def leases(self) -> str:
        return self.path(LEASES_DIR)

    @property
    def duplicates(self) -> str:
        return self._run("_ids", "duplicates.parquet")

    def staging(self, shard_id: str | None = None, attempt: str | None = None) -> str:
        parts = [p for p in (shard_id, attempt) if p]
        return self._run("_staging", *parts)

    def staged_part(self, shard_id: str, attempt: str, n: int) -> str:
        return self._run("_staging", shard_id, attempt, f"part-{n:05d}.parquet")

    @property
    def prediction(self) -> str:
        return self._run("_predictions", "prediction.json")

    @property
    def label_prior(self) -> str:
        return self._run("_calibration", "label_prior.json")

    def marker(self, shard_id: str) -> str:
        return self._run("_commits", f"{shard_id}.json")

    @property
    def commits(self) -> str:
        return self._run("_commits")

    @property
    def data(self) -> str:
        return self._run(DATA_DIR)

    def throughput(self, name: str | None = None) -> str:
        """The run's throughput series (throughput_series.py): one file per lane attempt."""
        return self._run("_metrics", "throughput", *([name] if name else []))

    def data_shard(self, shard_id: str) -> str:
        return self._run(DATA_DIR, shard_id)

    def data_part(self, shard_id: str, attempt: str, n: int) -> str:
        return self._run(DATA_DIR, shard_id, f"part-{attempt}-{n:05d}.parquet")

    def direct_part(self, shard_id: str, n: int = 0) -> str:
        """Where ``publish: direct`` creates a shard's part ``n``: the same name for every attempt, so the
        exclusive create lets one attempt's file exist there (an attempt id is never "direct")."""
        return self.data_part(shard_id, DIRECT_ATTEMPT, n)

    def direct_index(self, path: str) -> int | None:
        """N of a ``direct_part`` path of this run (any shard), else None."""
        if not path.startswith(self.data + "/"):
            return None
        found = _DIRECT_NAME.fullmatch(path.rsplit("/", 1)[-1])
        return int(found.group(1)) if found else None

    def is_direct(self, path: str) -> bool:
        """True for a ``direct_part`` path (of any shard of this run)."""
        return self.direct_index(path) is not None

    def rel(self, path: str) -> str:
        return path[len(self.store.root) :].lstrip("/")

    def data_glob(self) -> str:
        return self.store.url(self.path(DATA_DIR)) + "/**/*.parquet"

"""Where everything lives under the output root, in one place.

    OUTPUT/_prefixflow.json                      job fingerprint + spec (written once per run)
    OUTPUT/_ids/duplicates.parquet               rows whose id repeats an earlier row's id
    OUTPUT/_staging/<shard>/<attempt>/part-N.parquet   flushed, not yet committed
    OUTPUT/_commits/<shard>.json                 commit marker, created exclusively: the commit point
    OUTPUT/data/<shard>/part-<attempt>-N.parquet published copies of committed parts only
    OUTPUT/_manifest.json                        totals, written by finalize
    OUTPUT/_metrics/throughput/<lane>-<attempt>.json   throughput over time per lane attempt
    OUTPUT/_throughput.svg (.png)                tok/s over time, written by finalize

Readers glob ``OUTPUT/data/**/*.parquet``: data/ only ever receives parts listed in a marker, under
names fixed by that marker, so every input row appears there at most once, and exactly once after
finalize. Staged parts of unfinished or killed attempts live outside data/ and are never read.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixflow.pipeline.storage import Store

FINGERPRINT_FILE = "_prefixflow.json"
MANIFEST_FILE = "_manifest.json"
DATA_DIR = "data"
OWNED = (FINGERPRINT_FILE, MANIFEST_FILE, "_ids", "_staging", "_commits", DATA_DIR, "_metrics", "_throughput.svg",
         "_throughput.png")  # fmt: skip


@dataclass(frozen=True)
class Layout:
    store: Store

    def path(self, *parts: str) -> str:
        return self.store.join(*parts)

    @property
    def fingerprint(self) -> str:
        return self.path(FINGERPRINT_FILE)

    @property
    def manifest(self) -> str:
        return self.path(MANIFEST_FILE)

    @property
    def duplicates(self) -> str:
        return self.path("_ids", "duplicates.parquet")

    def staging(self, shard_id: str, attempt: str | None = None) -> str:
        return self.path("_staging", shard_id, attempt) if attempt else self.path("_staging", shard_id)

    def staged_part(self, shard_id: str, attempt: str, n: int) -> str:
        return self.path("_staging", shard_id, attempt, f"part-{n:05d}.parquet")

    def marker(self, shard_id: str) -> str:
        return self.path("_commits", f"{shard_id}.json")

    @property
    def commits(self) -> str:
        return self.path("_commits")

    def data_part(self, shard_id: str, attempt: str, n: int) -> str:
        return self.path(DATA_DIR, shard_id, f"part-{attempt}-{n:05d}.parquet")

    def rel(self, path: str) -> str:
        return path[len(self.store.root) :].lstrip("/")

    def data_glob(self) -> str:
        return self.store.url(self.path(DATA_DIR)) + "/**/*.parquet"

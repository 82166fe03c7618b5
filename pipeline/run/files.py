"""What one listing of an output root holds of one run, grouped by shard (run/handle.py, run_record.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefixflow.pipeline.storage.layout import RUN_SCOPED, Layout


@dataclass(frozen=True)
class RunFiles:
    """What one listing of the output root found of one run, by shard."""

    markers: frozenset[str]  # shard ids with a marker in _commits/<run>/
    staged: dict[str, tuple[str, ...]]  # shard id -> staged part paths (every attempt)
    data: dict[str, frozenset[str]]  # shard id -> files in data/<run>/<shard>/
    other_data: tuple[str, ...]  # files in data/<run>/ outside any shard folder
    paths: frozenset[str]  # every file listed below the root
    folders: dict[str, frozenset[str]]  # run-scoped top folder (layout.RUN_SCOPED) -> run ids below it

    @classmethod
    def of(cls, layout: Layout, listing: dict[str, dict[str, Any]]) -> RunFiles:
        markers: set[str] = set()
        staged: dict[str, list[str]] = {}
        data: dict[str, set[str]] = {}
        other: list[str] = []
        folders: dict[str, set[str]] = {top: set() for top in RUN_SCOPED}
        root = layout.store.root.rstrip("/") + "/"
        commits_dir, staging_dir, data_dir = layout.commits + "/", layout.staging() + "/", layout.data + "/"
        for path, info in listing.items():
            rel = path[len(root) :].split("/") if path.startswith(root) else []
            if len(rel) > 1 and rel[0] in folders:
                folders[rel[0]].add(rel[1])
            if info.get("type", "file") != "file":
                continue
            if path.startswith(commits_dir):
                name = path[len(commits_dir) :]
                if "/" not in name and name.endswith(".json"):
                    markers.add(name.removesuffix(".json"))
            elif path.startswith(staging_dir):
                rest = path[len(staging_dir) :].split("/")
                if len(rest) == 3 and rest[2].endswith(".parquet"):
                    staged.setdefault(rest[0], []).append(path)
            elif path.startswith(data_dir):
                rest = path[len(data_dir) :].split("/")
                if len(rest) >= 2:
                    data.setdefault(rest[0], set()).add(path)
                else:
                    other.append(path)
        return cls(
            frozenset(markers),
            {k: tuple(sorted(v)) for k, v in staged.items()},
            {k: frozenset(v) for k, v in data.items()},
            tuple(other),
            frozenset(p for p, i in listing.items() if i.get("type", "file") == "file"),
            {k: frozenset(v) for k, v in folders.items()},
        )

    def present(self, shard_id: str) -> frozenset[str]:
        """The shard's staged parts and data/ files at the listing."""
        return frozenset(self.staged.get(shard_id, ())) | self.data.get(shard_id, frozenset())

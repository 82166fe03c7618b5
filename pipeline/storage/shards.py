"""Shards: the units of work and of commit, each a row range of the input (or several small files).

Below the run and the tasks, so both name them; pipeline/run/planning.py decides them (``plan_shards``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """Rows [row_start, row_end) of one input file: what a shard reads."""

    path: str
    relpath: str
    row_start: int
    row_end: int


@dataclass(frozen=True)
class Shard:
    """A unit of work and of commit. ``error`` is set when the file could not be read at plan time.

    A shard reads one file's row range (``path``, ``row_start``, ``row_end``), or, packed, whole small
    files one after another (``pieces``; then ``path``/``relpath`` name the first file, and
    ``row_start``/``row_end`` are 0 and ``num_rows``)."""

    shard_id: str
    path: str
    row_start: int
    row_end: int
    num_rows: int
    relpath: str = ""
    error: str | None = None
    pieces: tuple[Piece, ...] = ()

    def ranges(self) -> tuple[Piece, ...]:
        """The row ranges this shard reads, in order (one unless packed)."""
        return self.pieces or (Piece(self.path, self.relpath, self.row_start, self.row_end),)


# a run's shards, or how to plan them (a lane holds only its own; a task that needs all of them plans once)
Shards = list[Shard] | Callable[[], list[Shard]]

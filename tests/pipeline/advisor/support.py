"""Datasets for the advisor tests: each built so one of the six answers must come out a known way."""

from __future__ import annotations

import random
import string
from pathlib import Path
from typing import Any

from tests.pipeline.support import write_parquet

WORDS = (
    "river stone cloud ember maple north quiet apple garden silver window market yellow "
    "winter summer forest ocean bridge castle engine"
).split()


def instruction(words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def unique_texts(n: int, words: int = 12, seed: int = 1) -> list[str]:
    """Texts whose first characters all differ (so prompts diverge right after any shared head); n <= 52."""
    rng = random.Random(seed)
    return [
        f"{h}{rng.choice(string.ascii_lowercase)} " + " ".join(rng.choice(WORDS) for _ in range(words))
        for h in string.ascii_letters[:n]
    ]


def random_prompts(n: int, chars: int = 200, seed: int = 2) -> list[str]:
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "    .,"
    return ["".join(rng.choice(alphabet) for _ in range(chars)) for _ in range(n)]


def write_rows(folder: Path, rows: list[dict[str, Any]], files: int = 2, row_group_size: int = 10) -> str:
    per = -(-len(rows) // files)
    for f in range(files):
        write_parquet(folder / f"part-{f}.parquet", rows[f * per : (f + 1) * per], row_group_size)
    return str(folder)

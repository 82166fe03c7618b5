"""`truncate` keeps the right part of a long document: its beginning, its end, or both ends."""

from __future__ import annotations

import re

import pytest

from prefixflow.pipeline import load_job
from prefixflow.pipeline.tasks.rows import RowPreparer
from tests.pipeline.support import job

WORDS = 300
LONG = " ".join(f"w{i}" for i in range(WORDS))


def _kept(tiny_llm, side: str) -> tuple[list[int], str]:
    cfg = job(
        "summarize",
        chat="off",
        template="Summarize: {{ document }}",
        summarize={"long_document": "truncate", "truncate_side": side},
    )
    spec = load_job("in/", "", "tiny", cfg)
    prep = RowPreparer(spec.config, tiny_llm, {}, spec.task)
    prepared = prep.prepare({"id": "long", "text": LONG}, {"id": "long"}, "d.parquet", 0)
    text = tiny_llm.tokenizer.decode(prepared.prompt, skip_special_tokens=True)
    assert text.startswith("Summarize: ")  # the template is kept whole
    return [int(w) for w in re.findall(r"\bw(\d+)\b", text)], text


@pytest.mark.parametrize("side", ["head", "tail", "both"])
def test_truncate_keeps_the_requested_side(tiny_llm, side: str) -> None:
    kept, text = _kept(tiny_llm, side)
    assert 10 < len(kept) < WORDS  # shortened, not emptied
    if side == "head":
        assert kept == list(range(len(kept)))  # w0, w1, ... : the beginning
    elif side == "tail":
        assert kept == list(range(WORDS - len(kept), WORDS))  # ..., w298, w299: the end
    else:
        assert kept[0] == 0 and kept[-1] == WORDS - 1 and " ... " in text
        gap = next(i for i in range(1, len(kept)) if kept[i] != kept[i - 1] + 1)
        assert kept[:gap] == list(range(gap)) and kept[gap:] == list(range(kept[gap], WORDS))
        assert gap >= 5 and len(kept) - gap >= 5  # a real share from each end (halves are in tokens)

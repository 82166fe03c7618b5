"""Bounded JSON strings (maxLength/minLength) are unrolled into one rule per character count, so their
token masks are precomputed (issue 27: a repetition of the JSON-character alternation made every mask
inside such a string a run-time scan of the whole vocabulary). The language must not change: the
unrolled grammar and the repetition give the same mask at every position, and the same verdicts."""

from __future__ import annotations

import json

import pytest
import torch

from prefixflow.engine import LLM
from prefixflow.engine.structured import backend
from prefixflow.engine.structured.bitmask import allocate_bitmask

xgr = pytest.importorskip("xgrammar")
LIMIT = backend.MAX_UNROLLED

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 6},
        "notes": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "long": {"type": "string", "maxLength": LIMIT + 1},
        "free": {"type": "string", "minLength": 1},
    },
    "required": ["name", "notes", "long", "free"],
    "additionalProperties": False,
}
TEXTS = [
    '{"name": "ab", "notes": [], "long": "", "free": "x"}',
    '{"name": "a\\"b\\\\c\\u00e9", "notes": ["x\\ny", "abc"], "long": "zz", "free": "\\t"}',
    '{"name": "abcdef", "notes": ["", "\\"\\"\\""], "long": "q", "free": "yy"}',
]
REFUSED = [
    '{"name": "a"',  # under minLength: the closing quote is refused
    '{"name": "abcdefg',  # over maxLength
    '{"name": "ab", "notes": ["abcd',
    '{"name": "a\tb',  # a raw control character
]


def grammars(monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    base = xgr.Grammar.from_json_schema(json.dumps(SCHEMA), any_whitespace=False, strict_mode=True)
    unrolled = backend.json_legal_strings(base)
    monkeypatch.setattr(backend, "MAX_UNROLLED", -1)  # the repetition, as before
    repeated = backend.json_legal_strings(base)
    return unrolled, repeated


def test_unrolled_only_where_bounded_and_short(monkeypatch):
    unrolled, repeated = grammars(monkeypatch)
    text = str(unrolled)
    assert "_at_0" in text and "_at_0" not in str(repeated)
    assert "{0, 6}" not in text.replace(" ", "") and "{2,6}" not in text.replace(" ", "")
    assert f"{{0, {LIMIT + 1}}}" in text  # too long: keeps the repetition
    assert "{1, -1}" in text  # unbounded above: keeps it too


def test_same_masks_and_verdicts_as_the_repetition(monkeypatch):
    llm = LLM("tiny", max_model_len=64)
    mgr = llm.engine.structured
    mgr._ensure_backend()
    unrolled, repeated = (mgr._compiler.compile_grammar(g) for g in grammars(monkeypatch))
    a_mask, b_mask = allocate_bitmask(1, mgr.vocab_size), allocate_bitmask(1, mgr.vocab_size)
    for text in TEXTS:
        a, b = xgr.GrammarMatcher(unrolled), xgr.GrammarMatcher(repeated)
        for ch in text:
            a.fill_next_token_bitmask(a_mask, 0)
            b.fill_next_token_bitmask(b_mask, 0)
            assert torch.equal(a_mask, b_mask), (text, ch)
            assert a.accept_string(ch) and b.accept_string(ch), (text, ch)
        assert a.is_completed() and b.is_completed()
    for text in REFUSED:
        for compiled in (unrolled, repeated):
            m = xgr.GrammarMatcher(compiled)
            ok = m.accept_string(text) and (not text.endswith('"a"') or m.accept_string(", "))
            assert not ok, text

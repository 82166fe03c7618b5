"""Prompt rendering: the sandbox holds, missing values are errors, bytes are decoded or classified."""

from __future__ import annotations

import pytest

from prefixflow.pipeline.errors import BAD_TYPE, NULL_PROMPT, TEMPLATE_ERROR, UNDECODABLE_TEXT, RowError
from prefixflow.pipeline.prompts import as_text, render_template, static_prefix, template_columns


@pytest.mark.parametrize(
    "source",
    [
        "{{ x.__class__.__mro__[1].__subclasses__() }}",  # classic sandbox escape
        "{{ x.upper.__globals__ }}",
        "{% set _ = items.append(1) %}{{ items }}",  # immutable sandbox: no mutation of row values
        "{{ missing }}",
    ],
)
def test_unsafe_or_undefined_templates_are_row_errors(source: str) -> None:
    with pytest.raises(RowError) as info:
        render_template(source, {"x": "text", "items": [1, 2]})
    assert info.value.error_class == TEMPLATE_ERROR


def test_template_helpers() -> None:
    assert render_template("Hi {{ name }}!", {"name": b"Ann"}) == "Hi Ann!"
    assert template_columns("{{ a }} {% for w in b %}{{ w }}{% endfor %}") == {"a", "b"}
    assert static_prefix("Summarize:\n{{ document }} end") == "Summarize:\n"


def test_cell_classification() -> None:
    assert as_text(b"ok", "c") == "ok"
    for value, cls in [(None, NULL_PROMPT), (b"\xff", UNDECODABLE_TEXT), (3, BAD_TYPE), ([1], BAD_TYPE)]:
        with pytest.raises(RowError) as info:
            as_text(value, "c")
        assert info.value.error_class == cls

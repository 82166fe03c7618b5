"""Prompt rendering: the sandbox holds, missing values are errors, bytes are decoded or classified."""

from __future__ import annotations

import pytest

from prefixflow.pipeline.errors import (
    BAD_TYPE,
    EMPTY_PROMPT,
    NULL_PROMPT,
    TEMPLATE_ERROR,
    UNDECODABLE_TEXT,
    RowError,
)
from prefixflow.pipeline.prompts.render import as_text, render_template, static_prefix, template_columns


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


@pytest.mark.parametrize(
    ("value", "error_class", "word"),
    [
        (None, NULL_PROMPT, "null"),
        ("", EMPTY_PROMPT, "blank"),
        (" \n\t", EMPTY_PROMPT, "blank"),
        (b"  ", EMPTY_PROMPT, "blank"),
    ],
)
@pytest.mark.parametrize(
    "source", ["Message: {{ body }}", "{{ body ~ '!' }}", "{{ body | trim }}", "{{ body.upper() }}"]
)
def test_a_printed_null_or_blank_cell_is_an_error_row(
    value, error_class: str, word: str, source: str
) -> None:
    """Regression (issue 14): `Message: {{ body }}` rendered 'Message: None' and was labeled at p=0.98."""
    with pytest.raises(RowError) as info:
        render_template(source, {"body": value, "other": "fine"})
    assert info.value.error_class == error_class
    assert f"column 'body' is {word}" in info.value.message and "{% if body %}" in info.value.message


@pytest.mark.parametrize(
    ("source", "null", "blank"),
    [
        ("{% if body %}Message: {{ body }}{% else %}No message{% endif %}", "No message", "No message"),
        ("Message: {{ body | default('none given') }}", "Message: none given", "Message: none given"),
        ("Message: {{ body or 'n/a' }}", "Message: n/a", "Message: n/a"),
        ("{{ 'null' if body is none else 'set' }}", "null", "set"),
        ("{{ 'undefined' if body is not defined else 'defined' }}", "undefined", "undefined"),
        ("{{ 'empty' if body == '' else 'other' }}", "other", "other"),
        ("Subject only: {{ subject }}", "Subject only: hi", "Subject only: hi"),  # body not referenced
    ],
)
def test_a_template_that_handles_null_or_blank_cells_keeps_working(
    source: str, null: str, blank: str
) -> None:
    assert render_template(source, {"body": None, "subject": "hi"}) == null
    assert render_template(source, {"body": "   ", "subject": "hi"}) == blank
    assert render_template("{{ 'empty' if body == '' else 'other' }}", {"body": ""}) == "empty"
    assert render_template("{{ n }} items, {{ flag }}", {"n": 0, "flag": False}) == "0 items, False"

"""Null and blank cells inside templates: an error row when printed, falsy when tested.

``Message: {{ body }}`` used to print ``None`` (or nothing) for a null (or blank) cell, and the row was
labeled or generated anyway, often with high confidence. Such a cell now reaches the template as a
``MissingCell``: printing it or using it as text makes the row a ``null_prompt`` / ``empty_prompt``
error row, while a template that handles it explicitly keeps working: ``{% if body %}``,
``{{ body | default('none given') }}``, ``{{ body or 'n/a' }}``, ``{% if body is none %}``.
"""

from __future__ import annotations

from typing import Any

import jinja2


class NullCellPrinted(jinja2.UndefinedError):
    """A template printed (or used as a value) a null cell."""


class BlankCellPrinted(jinja2.UndefinedError):
    """A template printed (or used as a value) an empty or whitespace-only text cell."""


def _guard_hint(name: str) -> str:
    return f"guard it with {{% if {name} %}}...{{% endif %}} or {{{{ {name} | default('...') }}}}"


class MissingCell(jinja2.StrictUndefined):
    """A null or blank cell: false in tests, replaced by ``default``, an error when printed."""

    __slots__ = ("_cell_value",)

    def __init__(self, name: str, value: str | None) -> None:
        kind, exc = ("null", NullCellPrinted) if value is None else ("blank", BlankCellPrinted)
        super().__init__(
            hint=f"column {name!r} is {kind} and the template prints it; {_guard_hint(name)}",
            name=name,
            exc=exc,
        )
        self._cell_value = value

    @property
    def is_null(self) -> bool:
        return self._cell_value is None

    def __bool__(self) -> bool:  # type: ignore[override]
        return False

    # StrictUndefined types these as raising (-> Never); a MissingCell compares as its cell's value.
    def __eq__(self, other: object) -> bool:  # type: ignore[override]
        if isinstance(other, MissingCell):
            return other._cell_value == self._cell_value
        return bool(other == self._cell_value)

    def __ne__(self, other: object) -> bool:  # type: ignore[override]
        return not self.__eq__(other)

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self._cell_value)


def cell_value(name: str, value: Any) -> Any:
    """What a template sees for a row cell: a ``MissingCell`` for null and blank text, else the value."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return MissingCell(name, value)
    return value


def is_none(value: Any) -> bool:
    """Jinja's ``none`` test, also true for a null cell (``{% if body is none %}``)."""
    return value is None or (isinstance(value, MissingCell) and value.is_null)

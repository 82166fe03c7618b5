"""Structured outputs: generation constrained to a JSON schema, regex, choice or EBNF grammar (xgrammar)."""

from prefixflow.engine.structured.backend import (
    REQUIREMENT,
    GrammarError,
    StructuredOutputsUnavailable,
    structured_outputs_error,
)
from prefixflow.engine.structured.params import StructuredOutputs

__all__ = [
    "REQUIREMENT",
    "GrammarError",
    "StructuredOutputs",
    "StructuredOutputsUnavailable",
    "structured_outputs_error",
]

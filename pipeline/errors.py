"""Exceptions and row error classes: the pipeline's vocabulary for what went wrong and whose fault it is."""

from __future__ import annotations


class PipelineError(Exception):
    """Base class: something the user must fix (config, paths, output state)."""


class JobConfigError(PipelineError, ValueError):
    """A job config or CLI flag is invalid; the message names the key and the allowed values."""


class InputError(PipelineError):
    """The input cannot be found or listed (no matching files, bad URL)."""


class FingerprintMismatch(PipelineError):
    """The output root holds a run with a different job fingerprint; refuse to mix the two."""


class InputChanged(FingerprintMismatch):
    """The input files of the output's run changed since it started (edited, removed or added files)."""


class OutputStateError(PipelineError):
    """The output root cannot hold a run (a file, unwritable, an unreadable fingerprint record)."""


class OutputBusy(PipelineError):
    """Another live process holds the output in a way this command cannot share (a --new-run while a job
    writes it, or a job while a --new-run replaces it); the message names the holder."""


class RunSuperseded(PipelineError):
    """A --new-run replaced the output's run while this process was writing it; nothing more is committed."""


class OutputNotPrepared(PipelineError):
    """run_shard/finalize was called before prepare_output wrote the job fingerprint."""


class ShardError(PipelineError):
    """One shard cannot run (corrupt or unreadable input file); other shards are unaffected."""

    def __init__(self, shard_id: str, message: str) -> None:
        super().__init__(f"shard {shard_id}: {message}")
        self.shard_id = shard_id


# Row-level error classes: a bad row becomes an output row with one of these in `error_class`.
NULL_ID = "null_id"
DUPLICATE_ID = "duplicate_id"
NULL_PROMPT = "null_prompt"
EMPTY_PROMPT = "empty_prompt"
TEMPLATE_ERROR = "template_error"
TEMPLATE_LIMIT = "template_limit"
BAD_TYPE = "bad_type"
UNDECODABLE_TEXT = "undecodable_text"
PROMPT_TOO_LONG = "prompt_too_long"
BAD_SAMPLING = "bad_sampling"
LABEL_PARSE_ERROR = "label_parse_error"
ENGINE_ERROR = "engine_error"
SCHEMA_ERROR = "schema"  # extract: the output is not a valid instance of the job's JSON schema
TRUNCATED_JSON = "truncated_json"  # extract: max_tokens ended the output before its JSON was complete

ERROR_CLASSES = (
    NULL_ID,
    DUPLICATE_ID,
    NULL_PROMPT,
    EMPTY_PROMPT,
    TEMPLATE_ERROR,
    TEMPLATE_LIMIT,
    BAD_TYPE,
    UNDECODABLE_TEXT,
    PROMPT_TOO_LONG,
    BAD_SAMPLING,
    LABEL_PARSE_ERROR,
    ENGINE_ERROR,
    SCHEMA_ERROR,
    TRUNCATED_JSON,
)


class RowError(Exception):
    """Raised while preparing one row; caught and turned into an error row (never escapes a shard)."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message

"""The job model: frozen pydantic sections, validated so a typo fails before any work.

Every message names the offending key (dotted path) and what is allowed, because a batch job that
dies an hour in over a misspelt key is the most expensive kind of typo. This module checks the shape
of a job (keys, types, allowed values, ranges); what needs a feature (a template compiles, a schema
loads, a label set scores) is checked by that feature, called from the task that uses it
(pipeline/tasks/, through ``spec.parse_job_config``).

Values are kept as written (an integer temperature stays an integer): the job fingerprint hashes them
(``JobConfig.as_record``), and a resumed run must hash an unchanged job the same way as the run that
started it.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from prefixflow.pipeline import engine_access
from prefixflow.pipeline.errors import JobConfigError

# how pipeline/tasks/label/scoring.py calibrates; the batch ones estimate each label's prior from a sample of the
# job's own rows (pipeline/tasks/label/batch.py)
BATCH_CALIBRATIONS = ("batch", "batch+contextual")
CALIBRATED_MODES = ("score", "constrained")  # label.calibration applies (constrained: to the first tokens)
BATCH_MIN_ROWS_PER_LABEL = 8  # fewer distinct sample rows than this x labels: batch falls back to contextual

DEFAULT_REDUCE_TEMPLATE = (
    "Combine these partial summaries of one document into one short summary.\n\n{{ summaries }}"
)


# -- options: the fields a flag, a flow parameter and a load_job override set --------------------------
@dataclass(frozen=True)
class Option:
    """Marks a job field as a ``load_job`` override. pipeline/job/flags.py builds the ``prefixflow run`` flag,
    ``load_job``'s shortcut and flows/flow.py's parameter from it. So a new option is one annotation here,
    and the three lists cannot drift apart."""

    help: str
    name: str = ""  # the override's name when it is not the field's (label.mode: label_mode)
    flag: bool = True  # False: a load_job override only (no flag, no flow parameter; a YAML job sets it)
    flag_name: str = ""  # when the flag is not --<name with dashes> (storage.options: --storage-option)


# -- errors: pydantic's, in the job config's own words ------------------------------------------------
def problem(message: str, at: str = "") -> PydanticCustomError:
    """A validation error whose text is ``message`` as written (``at``: a key below the field's path)."""
    return PydanticCustomError("job", "{message}", {"message": message, "at": at})


def unknown_key(key: object, allowed: typing.Iterable[str]) -> str:
    """``unknown key (did you mean 'x'?); allowed keys: ...``: the hint every misspelt key gets."""
    names = tuple(allowed)
    close = difflib.get_close_matches(str(key), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key{hint}; allowed keys: {', '.join(names)}"


def config_error(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> JobConfigError:
    """The first problem of ``exc`` as ``job config: <dotted path>: <what to fix>`` (an unknown key first,
    as the hand-written checks did)."""
    err = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    loc = [str(p) for p in err["loc"] if isinstance(p, int | str)]
    loc = [p for p in loc if "[" not in p and p not in _TYPE_TAGS]
    ctx = err.get("ctx") or {}
    if err["type"] == "job":
        message, loc = str(ctx["message"]), loc + ([str(ctx["at"])] if ctx.get("at") else [])
    elif err["type"] == "extra_forbidden":
        message = unknown_key(loc[-1], _fields_at(model, loc[:-1]))
    elif err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        message = f"expected a mapping, got {type(err['input']).__name__}"
    else:
        message = f"{err['msg'][:1].lower()}{err['msg'][1:]}, got {err['input']!r}"
    path = ".".join(([prefix] if prefix else []) + loc)
    return JobConfigError(f"job config: {path or '<root>'}: {message}")


_TYPE_TAGS = {"int", "float", "str", "bool", "none", "list", "tuple", "dict", "literal", "union"}


def _fields_at(model: type[BaseModel], loc: list[str]) -> tuple[str, ...]:
    for name in loc:
        field = model.model_fields.get(name) or next(
            (f for f in model.model_fields.values() if f.alias == name), None
        )
        inner = _model_of(field.annotation) if field is not None else None
        if inner is None:
            return ()
        model = inner
    return tuple(f.alias or n for n, f in model.model_fields.items())


def _model_of(hint: Any) -> type[BaseModel] | None:
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return hint
    for arg in typing.get_args(hint):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


# -- value rules (before pydantic's own type check, so the messages say what to write) ---------------
def _rule(check: Callable[[Any], bool], expected: str) -> BeforeValidator:
    def validate(value: Any) -> Any:
        if not check(value):
            raise problem(f"expected {expected}, got {value!r}")
        return value

    return BeforeValidator(validate)


def _choice(*allowed: str) -> BeforeValidator:
    def validate(value: Any) -> Any:
        if value not in allowed:
            raise problem(f"{value!r} is not allowed; allowed values: {', '.join(allowed)}")
        return value

    return BeforeValidator(validate)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _str_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise problem(f"expected a list of non-empty strings, got {value!r}")
    return tuple(value)


OptStr = Annotated[
    str | None, _rule(lambda v: v is None or (isinstance(v, str) and bool(v)), "a non-empty string")
]
PosInt = Annotated[int, _rule(lambda v: _is_int(v) and v >= 1, "a positive integer")]
Seconds = Annotated[int | float, _rule(lambda v: _is_number(v) and v > 0, "a positive number of seconds")]
StrList = Annotated[tuple[str, ...], BeforeValidator(_str_list)]
Flag = Annotated[bool, _rule(lambda v: isinstance(v, bool), "true or false")]


class Section(BaseModel):
    """A part of the job: unknown keys are refused, and nothing changes after validation."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# -- task sections ------------------------------------------------------------------------------------
class SummarizeConfig(Section):
    """``summarize:``: how summarization treats documents that do not fit the context (after the prompt
    and the output)."""

    document_column: Annotated[OptStr, Option("summarize: the document column", flag=False)] = "text"
    long_document: Annotated[
        Literal["error", "truncate", "map_reduce"],
        _choice("error", "truncate", "map_reduce"),
        Option("summarize: error, truncate or map_reduce", flag=False),
    ] = "truncate"
    truncate_side: Annotated[
        Literal["head", "tail", "both"],
        _choice("head", "tail", "both"),
        Option("summarize: head, tail or both", flag=False),
    ] = "head"
    # map_reduce chunk size; None: as large as the context allows
    chunk_tokens: Annotated[
        int | None, _rule(lambda v: v is None or (_is_int(v) and v >= 1), "a positive integer")
    ] = None
    reduce_template: OptStr = DEFAULT_REDUCE_TEMPLATE


LabelMode = Literal["score", "generate", "constrained"]
Calibration = Literal["batch", "batch+contextual", "contextual", "domain", "none"]


class LabelConfig(Section):
    """``label:``: score each label as a continuation (``score``), parse free-form output (``generate``)
    or generate under a constraint that allows exactly the labels (``constrained``)."""

    labels: Annotated[
        StrList, Option("labels of a label job, comma-separated, e.g. positive,negative,neutral")
    ] = ()
    mode: Annotated[
        LabelMode,
        _choice(*typing.get_args(LabelMode)),
        Option("label: score, generate or constrained", name="label_mode", flag=False),
    ] = "score"
    choice_prefix: Annotated[str, _rule(lambda v: isinstance(v, str), "a string")] = " "
    # score mode (docs/pipeline.md "Labeling jobs"): divide out the model's lean towards some labels,
    # measured on a sample of the job's rows (batch, Zhou et al. 2024), on reference prompts
    # (contextual | domain), or both (batch+contextual: the default, best on every set measured,
    # benchmarks/RESULTS.md issue 26); none: plain softmax
    calibration: Annotated[Calibration, _choice(*typing.get_args(Calibration))] = "batch+contextual"
    calibration_rows: PosInt = 256  # batch: rows sampled across shards at plan time to estimate the prior
    gold_column: OptStr = None  # an input column with the true label: the summary reports accuracy etc.
    # contextual: stand-ins for the row's values. Not "" (Zhao et al. use it too): a blank field is an
    # error row, never scored, and as a stand-in it over-corrected (benchmarks/RESULTS.md, issue 14)
    content_free: Annotated[
        tuple[str, ...],
        _rule(
            lambda v: isinstance(v, list | tuple) and bool(v) and all(isinstance(s, str) for s in v),
            'a non-empty list of strings ("" allowed)',
        ),
    ] = ("N/A", "[MASK]")
    length_norm: Annotated[Literal["sum", "mean"], _choice("sum", "mean")] = "sum"  # sum over tokens | mean
    case_variants: Flag = True  # "Billing" also counts for "billing" (and the reverse)


# -- run sections -------------------------------------------------------------------------------------
class OutputConfig(Section):
    """``output:``: sharding, flushing and publishing. ``shard_rows`` changes shard ids, so it is in the
    fingerprint."""

    shard_rows: Annotated[PosInt, Option("rows per shard (part of the job fingerprint)")] = 10_000
    flush_rows: Annotated[PosInt, Option("write a part file every N finished rows")] = 256
    flush_seconds: Annotated[Seconds, Option("... or every T seconds")] = 30.0
    # how a committed shard reaches data/ (docs/pipeline.md "Publishing"): ``direct`` creates every part at
    # its data/ name before the marker (3 round trips for one part: read, part, marker), ``copy`` stages
    # every part and copies it into data/ after the marker (4). Not in the fingerprint: a resume may switch.
    publish: Annotated[Literal["direct", "copy"], _choice("direct", "copy")] = "direct"


class TemplateLimits(Section):
    """Per-row limits on rendering a prompt template (pipeline/prompts/sandbox.py); a row over either becomes a
    ``template_limit`` error row instead of hanging or exhausting the run."""

    seconds: Seconds = 10.0
    max_chars: PosInt = 4_000_000


class StorageConfig(Section):
    """fsspec options for both input and output; ``endpoint_url`` targets S3-compatible stores.
    ``options`` may hold credentials, so they are never written to disk and left out of the repr."""

    endpoint_url: Annotated[OptStr, Option("S3-compatible endpoint, e.g. http://localhost:9000 (MinIO)")] = (
        None
    )
    options: Annotated[
        dict[str, Any],
        _rule(lambda v: isinstance(v, dict), "a mapping of fsspec options"),
        Option(
            "fsspec storage option (repeatable), e.g. anon=true; credentials come from "
            "the environment or the AWS credential chain (docs/pipeline.md#credentials)",
            name="storage_options",
            flag_name="--storage-option",
        ),
    ] = Field(default_factory=dict, repr=False)


_SECRET_WORDS = ("secret", "token", "password", "passwd", "credential", "private", "sas", "signature")
_SECRET_KEYS = {
    "key",
    "access_key",
    "access_key_id",
    "aws_access_key_id",
    "account_key",
    "api_key",
    "connection_string",
}


def secret_name_pattern() -> str:
    """A JSON-schema ``pattern`` (case-insensitive without inline flags, so every validator reads it the
    same) matching the option names ``secret_option_paths`` takes for credentials."""

    def nocase(word: str) -> str:
        return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in word)

    exact = "|".join(nocase(k) for k in sorted(_SECRET_KEYS))
    return f"^({exact})$|" + "|".join(nocase(w) for w in _SECRET_WORDS)


def secret_option_paths(options: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the storage options that look like credentials (``key``, ``secret``, ``token``,
    ``client_kwargs.aws_secret_access_key``, a password in a URL ...), searched through nested mappings."""
    found: list[str] = []
    if isinstance(options, dict):
        for name, value in options.items():
            path = f"{prefix}{name}"
            lowered = str(name).lower()
            if lowered in _SECRET_KEYS or any(w in lowered for w in _SECRET_WORDS):
                found.append(path)
            else:
                found += secret_option_paths(value, path + ".")
    elif isinstance(options, str) and "://" in options and "@" in options.split("://", 1)[1].split("/", 1)[0]:
        found.append(prefix.rstrip(".") or "<url>")  # user:password@host
    return found


# -- sampling: one field per SamplingParams field ------------------------------------------------------
class StructuredSection(Section):
    """``sampling.structured``: the fields of the engine's ``StructuredOutputs``, one to one."""

    json_schema: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool = False
    any_whitespace: bool = False

    def outputs(self) -> Any:
        """The engine's ``StructuredOutputs`` for this section."""
        return engine_access.StructuredOutputs(
            **{name: getattr(self, name) for name in self.model_fields_set}
        )


class SamplingSection(Section):
    """``sampling:``: the engine's ``SamplingParams`` fields, one to one (but ``prompt_logprobs``: no
    output column holds them); the engine's own ``validation_error`` checks the values, so a job and a
    request are held to the same rules. Numbers stay as written (see the module docstring)."""

    temperature: Annotated[int | float, Option("sampling temperature (0 = greedy, the default)")] = 0.0
    top_k: int = 0
    top_p: int | float = 1.0
    min_p: int | float = 0.0
    seed: int | None = None
    max_tokens: Annotated[int | None, Option("output length limit per row")] = None
    min_tokens: int = 0
    stop: str | tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured: StructuredSection | None = None
    presence_penalty: int | float = 0.0
    frequency_penalty: int | float = 0.0
    repetition_penalty: int | float = 1.0
    n: int = 1
    logit_bias: dict[int, int | float] | None = None  # token id -> added to its logit each step

    @model_validator(mode="before")
    @classmethod
    def _engine_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise problem(f"expected a mapping, got {type(data).__name__}")
        for key in data:
            if key not in cls.model_fields:
                raise problem(unknown_key(key, cls.model_fields), at=str(key))
        structured = data.get("structured")
        if structured is not None and not isinstance(structured, dict):
            raise problem(f"expected a mapping such as {{regex: '...'}}, got {structured!r}", at="structured")
        if isinstance(data.get("logit_bias"), dict):  # JSON and OpenAI write token ids as strings
            data = {**data, "logit_bias": _token_keys(data["logit_bias"])}
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k != "structured"
        }
        if values:
            error = engine_access.SamplingParams(**values).validation_error()
            if error:
                raise problem(error)
        return data

    def given(self) -> dict[str, Any]:
        """The values the job sets, as written (the fingerprint's view)."""
        return self.model_dump(exclude_unset=True)

    def params(self, structured: Any = None, **row_values: Any) -> Any:
        """The engine's ``SamplingParams``: the job's values, the job's constraint, then a row's own."""
        values = {name: getattr(self, name) for name in self.model_fields_set if name != "structured"}
        return engine_access.SamplingParams(**values, **row_values, structured=structured)

    def problem(self, vocab_size: int | None = None) -> str | None:
        """What is wrong with these values for a model of ``vocab_size`` tokens (the plan checks the
        rest without a model), or None."""
        return self.params().validation_error(vocab_size) if self.model_fields_set - {"structured"} else None


SAMPLING_KEYS = tuple(SamplingSection.model_fields)


def _token_keys(bias: dict[Any, Any]) -> dict[Any, Any]:
    """``{"50256": -100}`` as ``{50256: -100}``; other keys are left for the engine's check to name."""
    return {int(k) if isinstance(k, str) and k.strip().isdigit() else k: v for k, v in bias.items()}


def _sampling_columns(value: Any) -> Any:
    if not isinstance(value, dict):
        raise problem(f"expected a mapping, got {type(value).__name__}")
    for key, column in value.items():
        if key not in SAMPLING_KEYS:
            raise problem(unknown_key(key, SAMPLING_KEYS), at=str(key))
        if not isinstance(column, str) or not column:
            raise problem(f"expected a non-empty string, got {column!r}", at=str(key))
    if "structured" in value:
        raise problem("a constraint is set for the whole job, under sampling.structured", at="structured")
    if "logit_bias" in value:
        raise problem("a logit bias is set for the whole job, under sampling.logit_bias", at="logit_bias")
    return value


# -- the engine section: the engine's own EngineConfig decides ----------------------------------------
_INT64 = 2**63


def _type_problem(value: Any, hint: Any) -> str | None:
    """None when ``value`` fits the type ``hint`` of an EngineConfig field (int, float, bool, str,
    Literal and Optional of those), else what was expected. The engine's dataclass checks ranges but
    not types, and a wrong type there surfaces only when a shard runs (``seed=abc``: OverflowError)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return None if value in args else "one of " + ", ".join(map(str, args))
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = [_type_problem(value, a) for a in args if a is not type(None)]
        return None if None in problems else " or ".join(p for p in problems if p)
    if hint is bool:
        return None if isinstance(value, bool) else "true or false"
    if hint is int:
        ok = _is_int(value) and -_INT64 <= value < _INT64
        return None if ok else "an integer (64-bit)"
    if hint is float:
        return None if _is_number(value) else "a number"
    if hint is str:
        return None if isinstance(value, str) else "a string"
    return None


def _engine(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise problem(f"expected a mapping, got {type(value).__name__}")
    if not value:  # nothing to validate: skip importing the engine (and torch) for plan/status
        return {}
    config = engine_access.EngineConfig  # validated by the engine's own dataclass
    allowed = tuple(name for name in config.__dataclass_fields__ if name != "model")
    hints = typing.get_type_hints(config)
    for name, item in value.items():
        if name not in allowed:
            raise problem(unknown_key(name, allowed), at=str(name))
        wrong = _type_problem(item, hints[name])
        if wrong:
            raise problem(f"{item!r} is not {wrong}", at=str(name))
    try:
        config(**value)  # the deprecated attention_backend warns here, once, at load
    except (TypeError, ValueError) as exc:
        raise problem(str(exc)) from exc
    out = dict(value)
    if out.get("attention_backend") is not None:  # old name: store the new one, so both spell one fingerprint
        out["kernel_backend"] = out.pop("attention_backend")
    return out


def _chat(value: Any) -> Any:
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


# -- the job --------------------------------------------------------------------------------------------
_SECTIONS = (
    "sampling",
    "sampling_columns",
    "keep_columns",
    "summarize",
    "label",
    "output",
    "engine",
    "storage",
    "template_limits",
)


class JobConfig(Section):
    """One job: which rows become which prompts, how they are decoded, and how results are written.

    ``task`` names a registered task (pipeline/tasks/); ``spec.parse_job_config`` checks it against the
    registry and lets the task check its section. Built once per job, then never changed."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, serialize_by_alias=True)

    task: Annotated[
        str,
        _rule(lambda v: isinstance(v, str) and bool(v), "a task name"),
        Option(
            "generate (default), summarize, label or extract; a one-off job needs no YAML, e.g. "
            "--task label --labels positive,negative --template 'Review: {{ text }}'"
        ),
    ] = "generate"
    id_column: Annotated[OptStr, Option("column with unique row ids (default: file path + row index)")] = None
    prompt_column: Annotated[OptStr, Option("column used verbatim as the prompt")] = None
    messages_column: Annotated[  # list<struct<role, content>>: the conversation itself
        OptStr, Option("column holding the whole conversation (list of {role, content})")
    ] = None
    template: Annotated[
        OptStr, Option("Jinja2 prompt template over the row's columns, e.g. 'Summarize: {{ text }}'")
    ] = None
    chat: Annotated[Literal["auto", "on", "off"], _choice("auto", "on", "off"), BeforeValidator(_chat)] = (
        "auto"  # last runs first
    )
    system_prompt: Annotated[OptStr, Option("system prompt (chat template) or text before each prompt")] = (
        None
    )
    sampling: SamplingSection = Field(default_factory=SamplingSection)
    sampling_columns: Annotated[dict[str, str], BeforeValidator(_sampling_columns)] = Field(
        default_factory=dict
    )
    keep_columns: StrList = ()
    summarize: SummarizeConfig = Field(default_factory=SummarizeConfig)
    label: LabelConfig = Field(default_factory=LabelConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    engine: Annotated[
        dict[str, Any],
        BeforeValidator(_engine),
        Option("engine setting (repeatable), e.g. max_num_seqs=64"),
    ] = Field(default_factory=dict)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    template_limits: TemplateLimits = Field(default_factory=TemplateLimits)
    # task extract: the JSON schema; as given (a mapping, JSON text or a file path) until the extract task
    # loads it, then its content (so the fingerprint changes when the schema file does)
    json_schema: dict[str, Any] | str | None = Field(default=None, alias="schema")

    @model_validator(mode="before")
    @classmethod
    def _defaults_for_null(cls, data: Any) -> Any:
        """A section left empty in YAML (``sampling:`` alone) is the default section."""
        if not isinstance(data, dict):
            raise problem(f"expected a mapping, got {type(data).__name__}")
        return {k: v for k, v in data.items() if not (v is None and k in _SECTIONS)}

    @field_validator("keep_columns")
    @classmethod
    def _no_output_column(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        clash = sorted(set(value) & set(OUTPUT_COLUMNS))
        if clash:
            raise problem(
                f"{clash} would overwrite output columns ({', '.join(OUTPUT_COLUMNS)}); "
                "rename them in the input or leave them out"
            )
        return value

    @model_validator(mode="after")
    def _one_prompt_source(self) -> JobConfig:
        if self.prompt_column and self.template:
            raise problem("set either prompt_column or template, not both", at="template")
        if self.messages_column and self.template:  # a messages column is the whole prompt
            raise problem("set either messages_column or template, not both", at="template")
        return self

    def as_record(self) -> dict[str, Any]:
        """The job as plain data (the run record's ``job`` and the fingerprint's): every field, the
        sampling values as written."""
        out = self.model_dump(exclude={"sampling"})
        out["sampling"] = self.sampling.given()
        return out

    def replaced(self, **changes: Any) -> JobConfig:
        """A copy with ``changes`` (already valid values: a task's defaults, the loaded schema, options)."""
        return self.model_copy(update=changes)


# Columns every output row may have (pipeline/tasks/output_schema.py builds them); kept input columns may not reuse them.
OUTPUT_COLUMNS = (
    "id",
    "output",
    "finish_reason",
    "error",
    "error_class",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "latency_s",
    "truncated",
    "source_file",
    "row_index",
    "label",
    "label_probs",
    "label_logprobs_raw",
    "label_gold",
    "extracted",
    "samples",
)


def fold_speculative(data: Mapping[str, Any]) -> dict[str, Any]:
    """``speculative:`` (job YAML, --speculative-* flags) is the engine's ``speculative_config``."""
    if "speculative" not in data:
        return dict(data)
    rest = {k: v for k, v in data.items() if k != "speculative"}
    spec = data["speculative"]
    if spec is None:
        return rest
    if not isinstance(spec, dict):
        raise JobConfigError(
            f"job config: speculative: expected a mapping such as {{method: ngram}}, got {spec!r}"
        )
    engine = rest.get("engine") or {}
    if not isinstance(engine, dict):
        return dict(data)  # the engine section's own check names the problem
    if "speculative_config" in engine:
        raise JobConfigError("job config: speculative: set it here or as engine.speculative_config, not both")
    return {**rest, "engine": {**engine, "speculative_config": dict(spec)}}


def job_config(data: Mapping[str, Any] | None) -> JobConfig:
    """The job's shape validated (keys, types, allowed values) into a frozen JobConfig; the task's own
    checks come after (``spec.parse_job_config``)."""
    if data is not None and not isinstance(data, Mapping):
        raise JobConfigError(f"job config: <root>: expected a mapping, got {type(data).__name__}")
    folded = fold_speculative(data or {})
    try:
        return JobConfig.model_validate(folded)
    except ValidationError as exc:
        raise config_error(exc, JobConfig) from exc

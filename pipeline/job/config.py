"""Job configuration: frozen dataclasses built from YAML/dicts, validated so a typo fails before any work.

Every message names the offending key (dotted path) and what is allowed, because a batch job that
dies an hour in over a misspelt key is the most expensive kind of typo.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass, field, fields, replace
from typing import Any

from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.tasks.constraints import check_job_constraint, parse_schema

TASKS = ("generate", "summarize", "label", "extract")
CHAT_MODES = ("auto", "on", "off")
LONG_DOC_POLICIES = ("error", "truncate", "map_reduce")
TRUNCATE_SIDES = ("head", "tail", "both")
LABEL_MODES = ("score", "generate", "constrained")
CALIBRATED_MODES = ("score", "constrained")  # label.calibration applies (constrained: to the first tokens)
# how pipeline/tasks/label/scoring.py calibrates; the batch ones estimate each label's prior from a sample of the
# job's own rows (pipeline/tasks/label/batch.py)
LABEL_CALIBRATIONS = ("batch", "batch+contextual", "contextual", "domain", "none")
BATCH_CALIBRATIONS = ("batch", "batch+contextual")
BATCH_MIN_ROWS_PER_LABEL = 8  # fewer distinct sample rows than this x labels: batch falls back to contextual
LABEL_LENGTH_NORMS = ("sum", "mean")
SAMPLING_KEYS = (
    "temperature", "top_k", "top_p", "min_p", "seed", "max_tokens", "min_tokens", "stop",
    "stop_token_ids", "ignore_eos", "logprobs", "include_stop_str_in_output", "skip_special_tokens",
    "structured", "presence_penalty", "frequency_penalty", "repetition_penalty", "n", "logit_bias",
)  # fmt: skip

# Columns every output row has (pipeline/run/output_schema.py builds them); kept input columns may not reuse them.
OUTPUT_COLUMNS = ("id", "output", "finish_reason", "error", "error_class", "prompt_tokens", "cached_tokens",
                  "output_tokens", "latency_s", "truncated", "source_file", "row_index", "label", "label_probs", "label_logprobs_raw",
                  "label_gold", "extracted", "samples")  # fmt: skip

DEFAULT_SUMMARY_TEMPLATE = "Summarize the following text in one or two sentences.\n\n{{ document }}"
DEFAULT_REDUCE_TEMPLATE = (
    "Combine these partial summaries of one document into one short summary.\n\n{{ summaries }}"
)


@dataclass(frozen=True)
class SummarizeConfig:
    """How summarization treats documents that do not fit the context (after the prompt and output)."""

    document_column: str = "text"
    long_document: str = "truncate"
    truncate_side: str = "head"
    chunk_tokens: int | None = None  # map_reduce chunk size; None: as large as the context allows
    reduce_template: str = DEFAULT_REDUCE_TEMPLATE


@dataclass(frozen=True)
class LabelConfig:
    """Labeling: score each label as a continuation (``score``), parse free-form output (``generate``) or
    generate under a constraint that allows exactly the labels (``constrained``)."""

    labels: tuple[str, ...] = ()
    mode: str = "score"
    choice_prefix: str = " "
    # score mode (docs/pipeline.md "Labeling jobs"): divide out the model's lean towards some labels,
    # measured on a sample of the job's rows (batch, Zhou et al. 2024), on reference prompts
    # (contextual | domain), or both (batch+contextual: the default, best on every set measured,
    # benchmarks/RESULTS.md issue 26); none: plain softmax
    calibration: str = "batch+contextual"
    calibration_rows: int = 256  # batch: rows sampled across shards at plan time to estimate the prior
    gold_column: str | None = None  # an input column with the true label: the summary reports accuracy etc.
    # contextual: stand-ins for the row's values. Not "" (Zhao et al. use it too): a blank field is an
    # error row, never scored, and as a stand-in it over-corrected (benchmarks/RESULTS.md, issue 14)
    content_free: tuple[str, ...] = ("N/A", "[MASK]")
    length_norm: str = "sum"  # a label's log-prob: sum over its tokens | mean per token
    case_variants: bool = True  # "Billing" also counts for "billing" (and the reverse)


@dataclass(frozen=True)
class OutputConfig:
    """Sharding and flushing. ``shard_rows`` changes shard ids, so it is part of the fingerprint."""

    shard_rows: int = 10_000
    flush_rows: int = 256
    flush_seconds: float = 30.0


@dataclass(frozen=True)
class TemplateLimits:
    """Per-row limits on rendering a prompt template (pipeline/prompts/sandbox.py); a row over either becomes a
    ``template_limit`` error row instead of hanging or exhausting the run."""

    seconds: float = 10.0
    max_chars: int = 4_000_000


@dataclass(frozen=True)
class StorageConfig:
    """fsspec options for both input and output; ``endpoint_url`` targets S3-compatible stores.
    ``options`` may hold credentials, so they are never written to disk and left out of the repr."""

    endpoint_url: str | None = None
    options: dict[str, Any] = field(default_factory=dict, repr=False)


_SECRET_WORDS = ("secret", "token", "password", "passwd", "credential", "private", "sas", "signature")
_SECRET_KEYS = {"key", "access_key", "access_key_id", "aws_access_key_id", "account_key", "api_key",
                "connection_string"}  # fmt: skip


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


@dataclass(frozen=True)
class JobConfig:
    """One job: which rows become which prompts, how they are decoded, and how results are written."""

    task: str = "generate"
    id_column: str | None = None
    prompt_column: str | None = None
    messages_column: str | None = None  # list<struct<role, content>>: the conversation itself
    template: str | None = None
    chat: str = "auto"
    system_prompt: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    sampling_columns: dict[str, str] = field(default_factory=dict)
    keep_columns: tuple[str, ...] = ()
    summarize: SummarizeConfig = field(default_factory=SummarizeConfig)
    label: LabelConfig = field(default_factory=LabelConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    engine: dict[str, Any] = field(default_factory=dict)
    storage: StorageConfig = field(default_factory=StorageConfig)
    template_limits: TemplateLimits = field(default_factory=TemplateLimits)
    schema: dict[str, Any] | None = None  # task extract: the JSON schema (its content, also when given as a path)

    def effective_template(self) -> str | None:
        if self.template is None and self.prompt_column is None and self.task == "summarize":
            return DEFAULT_SUMMARY_TEMPLATE
        return self.template


def _fail(path: str, message: str) -> JobConfigError:
    return JobConfigError(f"job config: {path}: {message}")


def _check_keys(data: Any, allowed: tuple[str, ...], where: str) -> None:
    if not isinstance(data, dict):
        raise _fail(where or "<root>", f"expected a mapping, got {type(data).__name__}")
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            path = f"{where}.{key}" if where else str(key)
            raise _fail(path, f"unknown key{hint}; allowed keys: {', '.join(allowed)}")


def _choice(value: Any, allowed: tuple[str, ...], path: str) -> str:
    if value not in allowed:
        raise _fail(path, f"{value!r} is not allowed; allowed values: {', '.join(allowed)}")
    return str(value)


def _opt_str(value: Any, path: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise _fail(path, f"expected a non-empty string, got {value!r}")
    return value


def _pos_int(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(path, f"expected a positive integer, got {value!r}")
    return value


def _str_list(value: Any, path: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise _fail(path, f"expected a list of non-empty strings, got {value!r}")
    return tuple(value)


def _sub(cls: type, data: Any, where: str) -> dict[str, Any]:
    data = {} if data is None else data
    _check_keys(data, tuple(f.name for f in fields(cls)), where)
    return dict(data)


def _summarize(data: Any) -> SummarizeConfig:
    d = _sub(SummarizeConfig, data, "summarize")
    cfg = SummarizeConfig(**d)
    _opt_str(cfg.document_column, "summarize.document_column")
    _choice(cfg.long_document, LONG_DOC_POLICIES, "summarize.long_document")
    _choice(cfg.truncate_side, TRUNCATE_SIDES, "summarize.truncate_side")
    if cfg.chunk_tokens is not None:
        _pos_int(cfg.chunk_tokens, "summarize.chunk_tokens")
    _opt_str(cfg.reduce_template, "summarize.reduce_template")
    return cfg


def _label(data: Any, task: str) -> LabelConfig:
    d = _sub(LabelConfig, data, "label")
    if "labels" in d:
        d["labels"] = _str_list(d["labels"], "label.labels")
    if "content_free" in d:
        d["content_free"] = _content_free(d["content_free"])
    cfg = LabelConfig(**d)
    _choice(cfg.mode, LABEL_MODES, "label.mode")
    _choice(cfg.calibration, LABEL_CALIBRATIONS, "label.calibration")
    _choice(cfg.length_norm, LABEL_LENGTH_NORMS, "label.length_norm")
    _pos_int(cfg.calibration_rows, "label.calibration_rows")
    _opt_str(cfg.gold_column, "label.gold_column")
    if not isinstance(cfg.case_variants, bool):
        raise _fail("label.case_variants", f"expected true or false, got {cfg.case_variants!r}")
    if not isinstance(cfg.choice_prefix, str):
        raise _fail("label.choice_prefix", f"expected a string, got {cfg.choice_prefix!r}")
    if task == "label":
        if len(cfg.labels) < 2:
            raise _fail("label.labels", "a label job needs at least two labels, e.g. [positive, negative]")
        if len(set(cfg.labels)) != len(cfg.labels):
            raise _fail("label.labels", f"labels must be unique, got {list(cfg.labels)}")
        if cfg.mode == "score":
            _distinct_forms(cfg)
    return cfg


def _token_keys(bias: dict[Any, Any]) -> dict[Any, Any]:
    """``{"50256": -100}`` as ``{50256: -100}``; other keys are left for the engine's check to name."""
    return {int(k) if isinstance(k, str) and k.strip().isdigit() else k: v for k, v in bias.items()}


def _content_free(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) for v in value):
        raise _fail("label.content_free", f"expected a non-empty list of strings (\"\" allowed), got {value!r}")
    return tuple(value)


def _distinct_forms(cfg: LabelConfig) -> None:
    from prefixflow.pipeline.tasks.label.scoring import surface_forms

    seen: dict[str, str] = {}
    for label in cfg.labels:
        for form in surface_forms(label, cfg.case_variants):
            if form in seen and seen[form] != label:
                raise _fail("label.labels", f"{seen[form]!r} and {label!r} differ only in the case of their "
                            "first letter, which case_variants treats as the same answer; rename one or set "
                            "label.case_variants: false")  # fmt: skip
            seen[form] = label


def _output(data: Any) -> OutputConfig:
    cfg = OutputConfig(**_sub(OutputConfig, data, "output"))
    _pos_int(cfg.shard_rows, "output.shard_rows")
    _pos_int(cfg.flush_rows, "output.flush_rows")
    if (
        isinstance(cfg.flush_seconds, bool)
        or not isinstance(cfg.flush_seconds, (int, float))
        or cfg.flush_seconds <= 0
    ):
        raise _fail(
            "output.flush_seconds", f"expected a positive number of seconds, got {cfg.flush_seconds!r}"
        )
    return cfg


def _template_limits(data: Any) -> TemplateLimits:
    cfg = TemplateLimits(**_sub(TemplateLimits, data, "template_limits"))
    if isinstance(cfg.seconds, bool) or not isinstance(cfg.seconds, (int, float)) or cfg.seconds <= 0:
        raise _fail("template_limits.seconds", f"expected a positive number of seconds, got {cfg.seconds!r}")
    _pos_int(cfg.max_chars, "template_limits.max_chars")
    return cfg


def _storage(data: Any) -> StorageConfig:
    cfg = StorageConfig(**_sub(StorageConfig, data, "storage"))
    _opt_str(cfg.endpoint_url, "storage.endpoint_url")
    if not isinstance(cfg.options, dict):
        raise _fail("storage.options", f"expected a mapping of fsspec options, got {cfg.options!r}")
    return cfg


def _chat(value: Any) -> str:
    if value is True:
        return "on"
    if value is False:
        return "off"
    return _choice(value, CHAT_MODES, "chat")


def _fold_speculative(data: Any) -> Any:
    """``speculative:`` (job YAML, --speculative-* flags) is the engine's ``speculative_config``."""
    if not isinstance(data, dict) or "speculative" not in data:
        return data
    rest = {k: v for k, v in data.items() if k != "speculative"}
    spec = data["speculative"]
    if spec is None:
        return rest
    if not isinstance(spec, dict):
        raise _fail("speculative", f"expected a mapping such as {{method: ngram}}, got {spec!r}")
    engine = rest.get("engine") or {}
    if not isinstance(engine, dict):
        return data  # the engine section's own check names the problem
    if "speculative_config" in engine:
        raise _fail("speculative", "set it here or as engine.speculative_config, not both")
    return {**rest, "engine": {**engine, "speculative_config": dict(spec)}}


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
        ok = isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value < _INT64
        return None if ok else "an integer (64-bit)"
    if hint is float:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
    if hint is str:
        return None if isinstance(value, str) else "a string"
    return None


def _engine(data: Any) -> dict[str, Any]:
    d = {} if data is None else data
    if not d:  # nothing to validate: skip importing the engine (and torch) for plan/status
        return {}
    from prefixflow.pipeline.engine_access import EngineConfig  # validated by the engine's own dataclass

    _check_keys(d, tuple(f.name for f in fields(EngineConfig) if f.name != "model"), "engine")
    hints = typing.get_type_hints(EngineConfig)
    for name, value in d.items():
        problem = _type_problem(value, hints[name])
        if problem:
            raise _fail(f"engine.{name}", f"{value!r} is not {problem}")
    try:
        EngineConfig(**d)  # the deprecated attention_backend warns here, once, at load
    except (TypeError, ValueError) as exc:
        raise _fail("engine", str(exc)) from exc
    out = dict(d)
    if out.get("attention_backend") is not None:  # old name: store the new one, so both spell one fingerprint
        out["kernel_backend"] = out.pop("attention_backend")
    return out


def parse_job_config(data: dict[str, Any] | None) -> JobConfig:
    """Validate a job config mapping (as loaded from YAML) and build the frozen JobConfig."""
    data = _fold_speculative({} if data is None else data)
    _check_keys(data, tuple(f.name for f in fields(JobConfig)), "")
    task = _choice(data.get("task", "generate"), TASKS, "task")
    sampling = data.get("sampling") or {}
    _check_keys(sampling, SAMPLING_KEYS, "sampling")
    columns = data.get("sampling_columns") or {}
    _check_keys(columns, SAMPLING_KEYS, "sampling_columns")
    for key, col in columns.items():
        _opt_str(col, f"sampling_columns.{key}")
    if "structured" in columns:
        raise _fail("sampling_columns.structured", "a constraint is set for the whole job, under sampling.structured")
    if "logit_bias" in columns:
        raise _fail("sampling_columns.logit_bias", "a logit bias is set for the whole job, under sampling.logit_bias")
    if isinstance(sampling.get("logit_bias"), dict):  # JSON and OpenAI write token ids as strings
        sampling = {**sampling, "logit_bias": _token_keys(sampling["logit_bias"])}
    cfg = JobConfig(
        task=task,
        id_column=_opt_str(data.get("id_column"), "id_column"),
        prompt_column=_opt_str(data.get("prompt_column"), "prompt_column"),
        messages_column=_opt_str(data.get("messages_column"), "messages_column"),
        template=_opt_str(data.get("template"), "template"),
        chat=_chat(data.get("chat", "auto")),
        system_prompt=_opt_str(data.get("system_prompt"), "system_prompt"),
        sampling=dict(sampling),
        sampling_columns=dict(columns),
        keep_columns=_str_list(data.get("keep_columns") or [], "keep_columns"),
        summarize=_summarize(data.get("summarize")),
        label=_label(data.get("label"), task),
        output=_output(data.get("output")),
        engine=_engine(data.get("engine")),
        storage=_storage(data.get("storage")),
        template_limits=_template_limits(data.get("template_limits")),
        schema=parse_schema(data.get("schema"), task),
    )
    clash = sorted(set(cfg.keep_columns) & set(OUTPUT_COLUMNS))
    if clash:
        raise _fail("keep_columns", f"{clash} would overwrite output columns ({', '.join(OUTPUT_COLUMNS)}); "
                    "rename them in the input or leave them out")  # fmt: skip
    if cfg.prompt_column and cfg.template:
        raise _fail("template", "set either prompt_column or template, not both")
    if cfg.messages_column:
        _check_messages(cfg)
    if task == "generate" and not (cfg.prompt_column or cfg.template or cfg.messages_column):
        cfg = replace(cfg, prompt_column="prompt")
    if task in ("label", "extract") and not (cfg.prompt_column or cfg.template or cfg.messages_column):
        raise _fail("prompt_column", f"a {task} job needs prompt_column (a column) or template (Jinja2)")
    if task == "label" and cfg.summarize.long_document == "map_reduce" and "summarize" in data:
        raise _fail("summarize.long_document", "map_reduce applies to summarize jobs only")
    _check_sampling(cfg.sampling)
    if task != "generate" and (cfg.sampling.get("n", 1) != 1 or "n" in cfg.sampling_columns):
        raise _fail("sampling.n", "several samples per row apply to generate jobs only")
    check_job_constraint(cfg)
    _check_template(cfg.template, "template")
    if task == "label":
        from prefixflow.pipeline.tasks.label.references import check_references

        check_references(cfg)
    if task == "summarize":
        _check_template(cfg.summarize.reduce_template, "summarize.reduce_template")
    return cfg


def _check_messages(cfg: JobConfig) -> None:
    """A messages column is the whole prompt: no template over it, no documents to shorten. A
    ``prompt_column`` may stand beside it for rows whose messages cell is null."""
    if cfg.template:
        raise _fail("template", "set either messages_column or template, not both")
    if cfg.task == "summarize":
        raise _fail("messages_column", "applies to generate and label jobs; summarize reads a document column")


def _check_template(source: str | None, path: str) -> None:
    if source is None:
        return
    from prefixflow.pipeline.prompts.sandbox import compile_template

    try:
        compile_template(source)
    except Exception as exc:  # jinja2.TemplateSyntaxError and friends
        raise _fail(path, f"invalid Jinja2 template: {exc}") from exc


def sampling_problem(values: dict[str, Any], vocab_size: int | None = None) -> str | None:
    """What is wrong with the job-wide ``sampling:`` values, or None; with ``vocab_size`` (a loaded
    model's), the vocabulary-bound values too (the plan checks the rest without a model)."""
    if not values:
        return None
    from prefixflow.pipeline.engine_access import SamplingParams

    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k != "structured"}
    return SamplingParams(**values).validation_error(vocab_size)


def _check_sampling(values: dict[str, Any]) -> None:
    problem = sampling_problem(values)
    if problem:
        raise _fail("sampling", problem)


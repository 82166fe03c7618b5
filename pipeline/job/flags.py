"""The job's command-line flags and load_job overrides, built once from the job model for `prefixflow
run`/`plan`, `prefixflow serve` (flows/cli.py) and the batch_inference flow's parameters (flows/flow.py,
whose signature flows/parameters.py generates from JOB_OPTIONS).

Each JobOption is one load_job override: a flag, the flow parameter of the same name, where in the job
it lands (``at``: ``sampling.max_tokens``; load_job's shortcuts are derived from that), and how a parsed
flag value becomes the override value (by default the type of the job model's field there). The job
model marks its fields with ``Option`` (config.py), so adding one there adds the flag, the shortcut and
the flow parameter; only keys inside the engine's own sections are listed here (SECTION_OPTIONS).
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from prefixflow.pipeline.job.config import JobConfig, Option

DEFAULT_MODEL = "smollm2-135m-instruct"
MODEL_HELP = f"preset (tiny, {DEFAULT_MODEL}), HF folder or .gguf file (default: {DEFAULT_MODEL})"


def key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with the value read as YAML (``anon=true`` is a bool, ``max_num_seqs=8`` an int)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, yaml.safe_load(value)
    except yaml.YAMLError as exc:  # argparse turns this into one usage line, not a traceback
        problem = str(getattr(exc, "problem", None) or exc).strip()
        raise argparse.ArgumentTypeError(
            f"{key}={value!r}: the value is not valid YAML ({problem}); to pass "
            f"it as a string, quote it: {key}='...'"
        ) from exc


@dataclass(frozen=True)
class JobOption:
    """One load_job override and its flag (``--max-tokens`` sets ``max_tokens``)."""

    name: str
    help: str
    type: Callable[[str], Any] | None = None  # None: from the job model's field at ``at``
    repeatable: bool = False  # KEY=VALUE pairs, collected into a dict
    flag_name: str | None = None  # when the flag is not --<name with dashes>
    at: str = ""  # where the value goes in the job (``sampling.max_tokens``); "": the top-level key ``name``
    convert: Callable[[Any], Any] | None = None  # the value on its way into the job (GiB -> bytes)
    flagged: bool = True  # False: a load_job override only (no flag, no flow parameter)

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.at.split(".")) if self.at else (self.name,)

    @property
    def parse(self) -> Callable[[str], Any]:
        """How the flag's text becomes a value: the explicit ``type``, else the job model's field type."""
        return self.type or field_parser(self.path)

    @property
    def value_type(self) -> Any:
        """The type of the override's value (the flow parameter's, without ``None``): a dict for a
        repeatable KEY=VALUE option, else what the flag parser returns (``comma_list``: ``list[str]``)."""
        if self.repeatable:
            return dict[str, Any]
        parse = self.parse
        return parse if isinstance(parse, type) else typing.get_type_hints(parse)["return"]

    @property
    def flag(self) -> str:
        return self.flag_name or "--" + self.name.replace("_", "-")

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        if self.repeatable:
            parser.add_argument(
                self.flag,
                dest=self.name,
                type=self.parse,
                action="append",
                default=[],
                metavar="KEY=VALUE",
                help=self.help,
            )
        else:
            parser.add_argument(self.flag, dest=self.name, type=self.parse, help=self.help)

    def value(self, args: argparse.Namespace) -> Any:
        raw = getattr(args, self.name, None)
        return (dict(raw) if raw else None) if self.repeatable else raw


def gib_to_bytes(gib: Any) -> Any:
    """A size flag in GiB as the engine's byte count (anything else is left for the engine to refuse)."""
    return round(float(gib) * 2**30) if isinstance(gib, int | float) and not isinstance(gib, bool) else gib


def field_parser(path: tuple[str, ...]) -> Callable[[str], Any]:
    """The flag parser for the JobConfig field at ``path``: int, float (also for int | float), a comma
    list for a tuple of strings, else str."""
    model: type[BaseModel] = JobConfig
    hint: Any = str
    for name in path:
        field = model.model_fields.get(name)
        if field is None:
            return str  # a free-form section (engine, speculative): the option names its type
        hint = field.annotation
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            model = hint
    if typing.get_origin(hint) is tuple:
        return comma_list
    args = set(typing.get_args(hint)) - {type(None)} or {hint}
    if float in args:
        return float
    return int if args == {int} else str


def speculative_tokens(text: str) -> int | str:
    """``auto`` or a number of draft tokens per step (0 turns speculation off)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer, got {text!r}") from None


def comma_list(text: str) -> list[str]:
    """``a,b,c`` -> ``["a", "b", "c"]`` (spaces around the commas dropped)."""
    items = [part.strip() for part in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list without empty items, got {text!r}")
    return items


def model_options(model: type[BaseModel] = JobConfig, at: tuple[str, ...] = ()) -> list[JobOption]:
    """The options the job model marks (``Option`` on a field, config.py), sections walked in field order."""
    found: list[JobOption] = []
    for name, field in model.model_fields.items():
        path = (*at, field.alias or name)
        marker = next((m for m in field.metadata if isinstance(m, Option)), None)
        if marker is not None:
            found.append(
                JobOption(
                    marker.name or path[-1],
                    marker.help,
                    repeatable=typing.get_origin(field.annotation) is dict,
                    type=key_value if typing.get_origin(field.annotation) is dict else None,
                    flag_name=marker.flag_name or None,
                    at=".".join(path) if at else "",
                    flagged=marker.flag,
                )
            )
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found += model_options(field.annotation, path)
    return found


# Options inside the sections the job model leaves to the engine (engine:, speculative:): the engine's
# EngineConfig types and checks those keys, so each option names its flag type here.
SECTION_OPTIONS: tuple[JobOption, ...] = (
    JobOption(
        "quantization",
        at="engine.quantization",
        help="quantize a full-precision model while loading: int8, int4 or fp8 "
        "(pre-quantized GPTQ/AWQ/compressed-tensors/GGUF models need no flag; gguf keeps a GGUF file's "
        "blocks packed on the CPU too; docs/models.md)",
    ),
    JobOption(
        "tensor_parallel_size",
        at="engine.tensor_parallel_size",
        help="split the model over N devices in one engine (GPUs; CPU processes "
        "with gloo); a flow lane then takes N GPUs (engine.tensor_parallel_size)",
        type=int,
    ),
    JobOption(
        "kv_offload_gb",
        at="engine.kv_offload_bytes",
        convert=gib_to_bytes,
        help="host-memory KV tier in GiB (engine.kv_offload_bytes): evicted prefix blocks and "
        "preempted requests' KV are kept there and reloaded instead of recomputed (docs/engine.md)",
        type=float,
    ),
    JobOption(
        "kv_cache_dir",
        at="engine.kv_cache_dir",
        help="local directory of computed prompt KV blocks (engine.kv_cache_dir): a later run "
        "of the same model and prompts reloads them instead of computing them; safe to share between "
        "concurrent runs (docs/engine.md)",
    ),
    JobOption(
        "kv_cache_dir_gb",
        at="engine.kv_cache_dir_bytes",
        convert=gib_to_bytes,
        help="size cap of --kv-cache-dir in GiB, least recently used files evicted "
        "(engine.kv_cache_dir_bytes; default 16)",
        type=float,
    ),
    JobOption(
        "speculative_method",
        at="speculative.method",
        help="speculative decoding: ngram (prompt lookup) or draft_model "
        "(with --speculative-model); exact: outputs do not change (docs/engine.md)",
    ),
    JobOption(
        "num_speculative_tokens",
        at="speculative.num_speculative_tokens",
        help="draft tokens per step: auto (default: the engine speculates only where it pays) or a fixed k",
        type=speculative_tokens,
    ),
    JobOption(
        "speculative_model",
        at="speculative.model",
        help="the draft model of --speculative-method draft_model (same tokenizer)",
    ),
    JobOption(
        "pipeline_parallel_size",
        at="engine.pipeline_parallel_size",
        help="split the model's layers into P stages, P x T devices with "
        "--tensor-parallel-size T; fewer bytes between GPUs than TP on PCIe (engine.pipeline_parallel_size)",
        type=int,
    ),
)
ALL_OPTIONS: tuple[JobOption, ...] = (*model_options(), *SECTION_OPTIONS)
# the flags of `prefixflow run`/`plan`/`serve` and the flow's job parameters; storage ones also on `status`
STORAGE_OPTIONS = tuple(o for o in ALL_OPTIONS if o.flagged and o.path[0] == "storage")
JOB_OPTIONS = tuple(o for o in ALL_OPTIONS if o.flagged and o.path[0] != "storage")
# load_job overrides without a flag (a YAML job sets these; the Python API may override them)
API_OPTIONS = tuple(o for o in ALL_OPTIONS if not o.flagged)
JOB_OPTION_NAMES = tuple(o.name for o in (*JOB_OPTIONS, *STORAGE_OPTIONS))
# load_job(**overrides) shortcuts: option name -> (section, key), and the conversions on the way in
SHORTCUTS: dict[str, tuple[str, ...]] = {o.name: o.path for o in ALL_OPTIONS if o.at}
SHORTCUT_VALUES: dict[str, Callable[[Any], Any]] = {
    o.name: o.convert for o in ALL_OPTIONS if o.convert is not None
}


def add_storage_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--endpoint-url and --storage-option (also taken by `status`)."""
    for option in STORAGE_OPTIONS:
        option.add_to(parser)


def add_job_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, need_output: bool = True
) -> None:
    """--input, --output, --model, --job and every job option."""
    parser.add_argument("--input", required=True, help="Parquet file, folder, glob, or s3:// URL")
    if need_output:
        parser.add_argument(
            "--output", required=True, help="output folder or s3:// URL (results in OUTPUT/data/)"
        )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    parser.add_argument("--job", help="job config YAML (see configs/jobs/summarize.yaml, label.yaml)")
    for option in JOB_OPTIONS:
        option.add_to(parser)
    add_storage_flags(parser)


def add_new_run_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--new-run",
        action="store_true",
        help="discard an earlier run with a different job fingerprint in OUTPUT and start over "
        "(a run with the same fingerprint is resumed, not discarded)",
    )


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The load_job overrides (the same names as the flow's job parameters) the parsed flags set."""
    return job_overrides({o.name: o.value(args) for o in (*JOB_OPTIONS, *STORAGE_OPTIONS)})


def job_overrides(values: Mapping[str, Any]) -> dict[str, Any]:
    """The load_job overrides among ``values`` (parsed flags, or a flow's parameters): every option
    in JOB_OPTION_NAMES that is set."""
    return {k: values[k] for k in JOB_OPTION_NAMES if values.get(k) is not None}

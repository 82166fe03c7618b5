"""JobSpec: input + output + model + validated job config, and the job fingerprint derived from it."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import yaml

from prefixflow.pipeline.engine_access import Engine
from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.job.config import JobConfig, job_config
from prefixflow.pipeline.job.flags import SHORTCUT_VALUES, SHORTCUTS
from prefixflow.pipeline.prompts.render import template_columns
from prefixflow.pipeline.prompts.sandbox import check_template
from prefixflow.pipeline.tasks.base import Task
from prefixflow.pipeline.tasks.constraints import check_job_constraint
from prefixflow.pipeline.tasks.extract import schema_beside
from prefixflow.pipeline.tasks.registry import TASKS, task_of

FINGERPRINT_VERSION = 2  # 2: the model's identity (weights digests, resolved dtype) is included

# EngineConfig fields that cannot change what a row's output is, with the reason. Every other field,
# including any field the engine adds later, enters the job fingerprint when the job sets it: a new
# setting is assumed to matter until someone records here why it does not.
ENGINE_FIELDS_WITHOUT_OUTPUT_EFFECT: dict[str, str] = {
    "model": "the job's model argument and model_identity name the model",
    "device": "where the model runs; the dtype it resolves to is in model_identity",
    "max_num_seqs": "batch size: sampling noise depends on (seed, position) only",
    "max_num_batched_tokens": "per-step token budget: scheduling only",
    "kv_cache_memory_bytes": "KV pool size: preemption recomputes, outputs stay",
    "num_kv_blocks": "KV pool size: preemption recomputes, outputs stay",
    "gpu_memory_utilization": "KV pool size: preemption recomputes, outputs stay",
    "enable_prefix_caching": "a cache hit holds the KV the prompt would compute",
    "ordering": "admission order: scheduling only",
    "enforce_eager": "CUDA graphs replay the same kernels",
    "tensor_parallel_size": "how the same weights are split over devices",
    "distributed_timeout_s": "how long a tensor-parallel rank waits for a peer before failing",
    "kv_offload_bytes": "host KV tier: a reload holds the KV the prompt would compute",
    "kv_cache_dir": "disk KV tier: a block file holds the KV this model computes for that prefix",
    "kv_cache_dir_bytes": "disk KV tier's size cap: an evicted block is recomputed",
    "speculative_config": "verification emits exactly the tokens the model samples without it",
    "pipeline_parallel_size": "how the same layers are split over devices",
    "pipeline_micro_batches": "how a step is cut into micro-batches: scheduling only",
    "pipeline_virtual_engines": "how many steps are in flight at once: scheduling only",
}


def fingerprinted_engine_fields() -> tuple[str, ...]:
    """EngineConfig fields that enter the job fingerprint: all but ENGINE_FIELDS_WITHOUT_OUTPUT_EFFECT."""
    from prefixflow.pipeline.engine_access import EngineConfig

    return tuple(f.name for f in fields(EngineConfig) if f.name not in ENGINE_FIELDS_WITHOUT_OUTPUT_EFFECT)


@dataclass(frozen=True)
class JobSpec:
    """Everything needed to run (or resume) a job; plain data, so it pickles across processes."""

    input: str
    output: str
    model: str
    config: JobConfig

    @property
    def task(self) -> Task:
        return task_of(self.config)

    def prompt_columns(self) -> set[str]:
        cfg = self.config
        cols: set[str] = set()
        if cfg.prompt_column:
            cols.add(cfg.prompt_column)
        if cfg.messages_column:
            cols.add(cfg.messages_column)
        template = self.task.template(cfg)
        if template:
            cols |= template_columns(template)
        cols |= self.task.prompt_columns(cfg)
        return cols - {"document", "summaries"}

    def input_columns(self) -> list[str]:
        cfg = self.config
        cols = [cfg.id_column] if cfg.id_column else []
        cols += sorted(self.prompt_columns()) + list(cfg.sampling_columns.values()) + list(cfg.keep_columns)
        cols += list(self.task.input_columns(cfg))
        return list(dict.fromkeys(cols))

    def fingerprint(self) -> dict[str, Any]:
        """What makes two runs produce the same rows; flush timing and lane settings are left out."""
        cfg = self.config.as_record()
        cfg.pop("storage")
        out = cfg.pop("output")
        cfg["shard_rows"] = out["shard_rows"]
        kept = fingerprinted_engine_fields()
        cfg["engine"] = {k: v for k, v in sorted(self.config.engine.items()) if k in kept}
        return {
            "version": FINGERPRINT_VERSION,
            "input": self.input,
            "model": self.model,
            "model_identity": self.model_identity(),
            "job": cfg,
        }

    def model_identity(self) -> dict[str, Any]:
        """What ``model`` refers to (weights digests, resolved dtype), from the engine without loading it.

        Raises JobConfigError (naming what is accepted) when the model argument names nothing loadable.
        """
        engine = self.config.engine
        return model_identity(
            self.model,
            str(engine.get("dtype") or "auto"),
            str(engine.get("device") or "auto"),
            engine.get("quantization"),
            str(engine.get("cpu_int8") or "auto"),
        )

    def fingerprint_hash(self) -> str:
        blob = json.dumps(self.fingerprint(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def model_identity(
    model: str,
    dtype: str = "auto",
    device: str = "auto",
    quantization: str | None = None,
    cpu_int8: str = "auto",
) -> dict[str, Any]:
    """``engine.describe_model``, memoized per model files' sizes and mtimes (a replaced checkpoint is
    described again); a bad model argument (or quantization) becomes a JobConfigError with the engine's
    message."""
    return copy.deepcopy(_describe(model, dtype, device, quantization, cpu_int8, _stat_key(model)))


def open_engine(spec: JobSpec) -> Engine:
    """Load ``spec.model`` with the job's engine settings; a lane loads it once and reuses it for many
    shards. Settings the engine rejects while loading (a KV budget too small for one sequence, weights
    it cannot read) raise JobConfigError with the engine's message, like any other bad job setting."""
    from prefixflow.engine import LLM
    from prefixflow.engine.loading.model_identity import resolve_device

    job_engine = spec.config.engine
    device = resolve_device(str(job_engine.get("device") or "auto"))
    options = {**spec.task.engine_defaults(spec.config, device), **job_engine}
    try:
        llm: Engine = LLM(model=spec.model, **options)
    except (
        ValueError
    ) as exc:  # engine.loading.model_identity.ModelNotFoundError and EngineConfig/KV-budget checks
        settings = options or "the default engine settings"
        raise JobConfigError(f"cannot load model {spec.model!r} with {settings}: {exc}") from exc
    return llm


StatKey = tuple[tuple[str, int, int], ...]


@functools.lru_cache(maxsize=32)
def _describe(
    model: str, dtype: str, device: str, quantization: str | None, cpu_int8: str, stat_key: StatKey
) -> dict[str, Any]:
    from prefixflow.pipeline.engine_access import describe_model

    try:
        return dict(
            describe_model(model, dtype=dtype, device=device, quantization=quantization, cpu_int8=cpu_int8)
        )
    except ValueError as exc:  # engine.loading.model_identity.ModelNotFoundError names what is accepted
        text = str(exc)
        raise JobConfigError(text if text.startswith("model") else f"model {model!r}: {text}") from exc


def _stat_key(model: str) -> StatKey:
    path = os.path.expanduser(model)
    try:
        names = sorted(os.listdir(path)) if os.path.isdir(path) else [""]
        stats = [os.stat(os.path.join(path, n)) if n else os.stat(path) for n in names]
    except OSError:
        return ()
    return tuple((n, st.st_size, st.st_mtime_ns) for n, st in zip(names, stats))


def _read_job(job: str | dict[str, Any] | None) -> dict[str, Any]:
    if job is None:
        return {}
    if isinstance(job, dict):
        return copy.deepcopy(job)
    if not isinstance(job, (str, os.PathLike)):
        raise JobConfigError(f"job must be a YAML path, a dict or None, got {type(job).__name__}")
    path = os.fspath(job)
    if not os.path.isfile(path):
        raise JobConfigError(f"job config file {path!r} not found (see configs/jobs/ for examples)")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as exc:
        raise JobConfigError(f"job config {path!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise JobConfigError(f"job config {path!r} must be a mapping of keys, got {type(data).__name__}")
    if isinstance(data.get("schema"), str):  # extract: a relative schema path is read beside the job file
        data["schema"] = schema_beside(data["schema"], os.path.dirname(os.path.abspath(path)))
    return data


def _apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    top = {f.alias or name for name, f in JobConfig.model_fields.items()}
    for key, value in overrides.items():
        if value is None:
            continue
        if key in SHORTCUTS:
            section, sub = SHORTCUTS[key]
            node = data.setdefault(section, {}) or {}
            if not isinstance(node, dict):
                raise JobConfigError(f"job config: {section}: expected a mapping, got {node!r}")
            data[section] = node
            node[sub] = SHORTCUT_VALUES.get(key, lambda v: v)(value)
        elif key in top:
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        else:
            allowed = ", ".join(sorted(top | set(SHORTCUTS)))
            raise JobConfigError(f"load_job: unknown override {key!r}; allowed: {allowed}")
    return data


def load_job(
    input: str, output: str, model: str, job: str | dict[str, Any] | None = None, **overrides: Any
) -> JobSpec:
    """Build and validate a JobSpec; raises JobConfigError naming the bad key before any work starts.

    ``output`` may be "" for planning only (prepare_output refuses it).
    """
    if not isinstance(input, str) or not input:
        raise JobConfigError("input: pass a Parquet file, folder, glob or s3:// URL")
    if not isinstance(model, str) or not model:
        raise JobConfigError(
            "model: pass a preset name (tiny, smollm2-135m-instruct), an HF folder or a .gguf"
        )
    if not isinstance(output, str):
        raise JobConfigError("output: pass a local folder or an s3:// URL")
    data = _apply_overrides(_read_job(job), overrides)
    return JobSpec(
        input=_normalize(input), output=_normalize(output), model=model, config=parse_job_config(data)
    )


def parse_job_config(data: Mapping[str, Any] | None) -> JobConfig:
    """Validate a job config mapping (as loaded from YAML) into the frozen JobConfig: its shape
    (config.py), then what its task and the features it uses check (templates compile, the schema
    loads, the labels can be scored, the constraint compiles)."""
    cfg = job_config(data)
    task = task_of(cfg)
    if cfg.json_schema is not None and not task.takes_schema:
        owners = " and ".join(t.name for t in TASKS.values() if t.takes_schema)
        raise JobConfigError(
            f"job config: schema: applies to {owners} jobs only (this job is task: {cfg.task})"
        )
    if not task.several_samples and (cfg.sampling.n != 1 or "n" in cfg.sampling_columns):
        owners = " and ".join(t.name for t in TASKS.values() if t.several_samples)
        raise JobConfigError(f"job config: sampling.n: several samples per row apply to {owners} jobs only")
    cfg = task.check(cfg, data or {})
    clash = sorted(set(cfg.keep_columns) & {f.name for f in task.output_fields(cfg)})
    if clash:  # the built-in tasks' columns are refused by the model already; a new task's here
        raise JobConfigError(
            f"job config: keep_columns: {clash} would overwrite output columns of the {cfg.task} "
            "task; rename them in the input or leave them out"
        )
    check_job_constraint(cfg, task)
    check_template(cfg.template, "template")
    return cfg


def _normalize(url: str) -> str:
    """One spelling per location (``docs``, ``./docs/`` -> ``/abs/docs``), so a resume from another
    working directory or with a trailing slash has the same fingerprint."""
    if not url:
        return url
    if "://" in url:
        return url.rstrip("/") if not url.endswith("://") else url
    return os.path.abspath(os.path.expanduser(url))

"""``advise(spec)``: sample the input, render it with the real tokenizer, and answer the six questions.

Torch-free unless ``pilot_rows`` asks for a pilot run: the model is read through ``inspect_model``
(config and tokenizer, no weights), and the cost model is plain arithmetic.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from prefixflow.pipeline.advisor.devices import Device, get_device
from prefixflow.pipeline.advisor.engine_path import cpu_auto_dtype, engine_path
from prefixflow.pipeline.advisor.estimate import Estimate, estimate_all
from prefixflow.pipeline.advisor.labels import label_advice
from prefixflow.pipeline.advisor.memory import (
    EngineLimits,
    Fit,
    choose_precision,
    fit,
    model_context_limit,
    native_precision,
    precisions_for,
    weight_bytes,
)
from prefixflow.pipeline.advisor.questions import Answer, Facts, answer_all
from prefixflow.pipeline.advisor.render import TokenizerOnlyModel, render_sample
from prefixflow.pipeline.advisor.roofline import ModelShape
from prefixflow.pipeline.advisor.sharing import Sharing, analyze
from prefixflow.pipeline.advisor.template_order import OrderFlag, check_column, check_template
from prefixflow.pipeline.advisor.workload import PilotResult, Workload, build_workload
from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.job.config import JobConfig
from prefixflow.pipeline.job.spec import JobSpec
from prefixflow.pipeline.run.planning import plan_shards
from prefixflow.pipeline.storage.sample import Sample, sample_rows
from prefixflow.pipeline.storage.shards import Shard
from prefixflow.pipeline.tasks.base import Task

DEFAULT_SAMPLE_ROWS = 2000


@dataclass
class Advice:
    model: dict[str, Any]
    device: Device
    workload: Workload
    sharing: Sharing
    flag: OrderFlag | None
    fits: dict[str, Fit]
    kv_bytes_per_token: int
    answers: list[Answer]
    settings: dict[str, Any]
    estimates: list[Estimate]
    timings: dict[str, float] = field(default_factory=dict)
    skipped_shards: list[str] = field(default_factory=list)
    labels: dict[str, Any] = field(default_factory=dict)  # label jobs: advisor/labels.py

    def largest(self) -> dict[str, Any]:
        """The largest max_model_len and max_num_seqs that fit at the recommended precision: the pool's
        tokens (within the model's context), and sequences of the sample's p99 size all running at once."""
        precision = self.settings.get("quantization") or next(iter(self.fits))
        f = self.fits[precision]
        return {"precision": precision, "max_model_len": f.max_model_len, "max_num_seqs": f.seqs_at_p99}

    def as_dict(self) -> dict[str, Any]:
        s = self.sharing
        return {
            "model": self.model,
            "device": dataclasses.asdict(self.device),
            "tokens": self.workload.as_dict(),
            "sharing": {
                "requests": s.requests,
                "prompt_tokens": s.prompt_tokens,
                "distinct_tokens": s.distinct_tokens,
                "block_size": s.block_size,
                "block_min_tokens": s.block_min_tokens,
                "best_hit_rate": s.best_hit_rate,
                "cache_blocks_needed": s.cache_blocks_needed,
                "heads": [dataclasses.asdict(h) for h in s.heads],
                "template_flag": dataclasses.asdict(self.flag) if self.flag else None,
            },
            "memory": {
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "largest": self.largest(),
                "precisions": {
                    p: {**dataclasses.asdict(f), "fits": f.fits, "headroom": f.headroom}
                    for p, f in self.fits.items()
                },
            },
            "answers": [dataclasses.asdict(a) for a in self.answers],
            "recommended": self.settings,
            "estimates": [
                {
                    **dataclasses.asdict(e),
                    "bound_by": e.bound_by,
                    "output_tokens_per_s": e.output_tokens_per_s,
                }
                for e in self.estimates
            ],
            "skipped_shards": self.skipped_shards,
            "labels": self.labels,
            "timings_s": self.timings,
        }


def _card(model: str) -> Any:
    from prefixflow.pipeline.engine_access import inspect_model

    try:
        return inspect_model(model)
    except ValueError as exc:  # ModelNotFoundError names what is accepted
        text = str(exc)
        raise JobConfigError(text if text.startswith("model") else f"model {model!r}: {text}") from exc


def _device(spec: JobSpec, gpu: str) -> Device:
    try:
        device = get_device(gpu)
    except ValueError as exc:
        raise JobConfigError(f"--gpu: {exc}") from exc
    dtype = str(spec.config.engine.get("dtype") or "auto")
    device = dataclasses.replace(device, dtype=dtype) if dtype != "auto" else device
    engine = spec.config.engine  # the job's own group: its TP x PP devices hold the weights together
    return device.group(
        int(engine.get("tensor_parallel_size") or 1) * int(engine.get("pipeline_parallel_size") or 1)
    )


def _cpu_dtype(device: Device, spec: JobSpec, card: Any) -> Device:
    """On the CPU with ``dtype: auto``, the dtype the engine picks for this model on this host (bf16 for
    the embedded GGUF on a CPU with native bf16), which sets the matmul ceiling and the KV bytes."""
    if device.is_gpu or str(spec.config.engine.get("dtype") or "auto") != "auto":
        return device
    dtype = cpu_auto_dtype(spec.model, card.checkpoint_precision, "bf16" in device.flops)
    return dataclasses.replace(device, dtype=dtype)


def _order_flag(
    cfg: JobConfig, task: Task, sample: Sample, tokenizer: Any, block_size: int
) -> OrderFlag | None:

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False)) if text else 0

    rows = [s.row for s in sample.rows]
    template = task.template(cfg)
    if template:
        document = task.document_column(cfg)
        aliases = {"document": document} if document else {}
        return check_template(template, rows, count, block_size, aliases)
    if cfg.prompt_column:
        values = [v for v in (r.get(cfg.prompt_column) for r in rows) if isinstance(v, str)]
        return check_column(cfg.prompt_column, values, count, block_size)
    return None


def advise(
    spec: JobSpec,
    gpu: str = "local",
    sample_size: int = DEFAULT_SAMPLE_ROWS,
    pilot_rows: int = 0,
    card: Any = None,
    pilot: PilotResult | None = None,
    shards: list[Shard] | None = None,
) -> Advice:
    """The whole report. ``card`` reuses an inspected model; ``pilot`` a pilot already run; ``shards``
    the job's plan (a run's, planned already)."""
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    device = _device(spec, gpu)  # a bad --gpu fails before the input is read
    shards = shards if shards is not None else plan_shards(spec)
    sample = sample_rows(spec, shards, sample_size)
    timings["sample_s"] = time.perf_counter() - t0
    card = card or _card(spec.model)
    device = _cpu_dtype(device, spec, card)
    timings["model_s"] = time.perf_counter() - t0 - timings["sample_s"]
    cfg = spec.config
    shape = ModelShape.from_config(card.hf_config)
    limits = EngineLimits.from_engine(cfg.engine)
    precision, tp = choose_precision(shape, card.hf_config, device, limits)  # the pool, before the sample
    pool = fit(shape, card.hf_config, device, limits, precision)
    max_len = (
        pool.max_model_len if tp == 1 and pool.kv_blocks >= 2 else model_context_limit(card.hf_config, limits)
    )
    t = time.perf_counter()
    rendered = render_sample(cfg, TokenizerOnlyModel(card, max_len), sample)
    timings["render_s"] = time.perf_counter() - t
    t = time.perf_counter()
    sharing = analyze(
        [r.tokens for r in rendered.requests],
        [r.row for r in rendered.requests],
        limits.block_size,
        lambda ids: card.tokenizer.decode(ids),
        suffixes=rendered.suffixes,
    )
    flag = _order_flag(cfg, spec.task, sample, card.tokenizer, limits.block_size)
    timings["sharing_s"] = time.perf_counter() - t
    target_eff = None
    if pilot_rows and pilot is None:
        from prefixflow.pipeline.advisor.pilot import run_pilot

        t = time.perf_counter()
        pilot = run_pilot(spec, sample, pilot_rows)
        timings["pilot_s"] = time.perf_counter() - t
    if pilot is not None and gpu == "local":
        from prefixflow.pipeline.advisor.pilot import pilot_efficiency

        target_eff = pilot_efficiency(pilot, shape, device, limits)
    workload = build_workload(rendered, sharing, sample.total_rows, max_len, pilot)
    seqs = workload.footprint(sharing.heads[0].tokens // limits.block_size if sharing.heads else 0)
    fits = {p: fit(shape, card.hf_config, device, limits, p, seqs) for p in precisions_for(device)}
    facts = Facts(
        cfg,
        card.hf_config,
        shape,
        device,
        limits,
        fits,
        workload,
        sharing,
        flag,
        seqs,
        (card.checkpoint_precision, card.checkpoint_bytes),
    )
    answers = answer_all(facts)
    dense = weight_bytes(shape, native_precision(device))
    path = engine_path(
        spec.model,
        device.dtype,
        "cuda" if device.is_gpu else "cpu",
        cfg.engine.get("quantization"),
        card.checkpoint_precision,
        dense,
        device.memory_bytes // max(device.devices, 1),
    )
    estimates = estimate_all(shape, card.hf_config, device, workload, limits, seqs, target_eff, path)
    timings["total_s"] = time.perf_counter() - t0
    model = {
        "model": spec.model,
        "name": card.name,
        "format": card.format,
        "checkpoint_precision": card.checkpoint_precision,
        "checkpoint_bytes": card.checkpoint_bytes,
        "params": shape.total_params,
        "layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "kv_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "context": model_context_limit(card.hf_config, limits),
        "engine_path": dataclasses.asdict(path),
    }
    kv_elem = 4 if device.dtype == "float32" else 2
    labels = label_advice(cfg, card.tokenizer, rendered, sample)
    return Advice(
        model,
        device,
        workload,
        sharing,
        flag,
        fits,
        shape.kv_bytes_per_token(kv_elem),
        answers,
        facts.settings,
        estimates,
        timings,
        sample.skipped_shards,
        labels,
    )

"""The six questions, answered from the facts the advisor gathered, each with its evidence and the
setting it leads to. Thresholds are stated where they are used."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefixflow.pipeline.advisor.devices import Device
from prefixflow.pipeline.advisor.host_tier import host_memory_bytes, recommend_offload_bytes
from prefixflow.pipeline.advisor.memory import (
    HEADROOM,
    EngineLimits,
    Fit,
    Footprint,
    choose_precision,
    crossover_tokens,
    fit,
    native_precision,
)
from prefixflow.pipeline.advisor.roofline import ModelShape
from prefixflow.pipeline.advisor.sharing import Sharing
from prefixflow.pipeline.advisor.speculation import REPLAY_K
from prefixflow.pipeline.advisor.template_order import OrderFlag
from prefixflow.pipeline.advisor.workload import Dist, Workload
from prefixflow.pipeline.job.config import JobConfig

SHARING_YES = 0.05  # prefix hit rate worth keeping the prefix cache and ordering for
VARIABLE_CV = 0.25  # output length spread (std / mean) that makes static batching waste slots
PAGING_GAIN = 1.5  # paged / contiguous concurrency ratio at which paging decides the batch size
MAX_SEQS_CAP = 1024
SPECULATION_PAYS = 1.3  # tokens per decode step under n-gram lookup (pilot replay) worth speculating for
QUANT_METHODS = {  # the engine's `quantization:` setting quantizes a full-precision checkpoint as it loads
    "fp8": "fp8 W8A8 (engine quantization: fp8, or an fp8 compressed-tensors checkpoint)",
    "int8": "int8 weights (engine quantization: int8)",
    "int4": "int4 weights, groups of 128 (engine quantization: int4, or a GPTQ/AWQ checkpoint)",
}
GB = 1e9


@dataclass(frozen=True)
class Answer:
    number: int
    question: str
    verdict: str  # yes | no | likely | not applicable
    evidence: list[str]
    recommendation: str


@dataclass
class Facts:
    cfg: JobConfig
    hf_config: dict[str, Any]
    shape: ModelShape
    device: Device
    limits: EngineLimits
    fits: dict[str, Fit]  # per precision on the target device
    workload: Workload
    sharing: Sharing
    flag: OrderFlag | None
    seqs: Footprint
    checkpoint: tuple[str, int | None] = ("", None)  # how the checkpoint stores its weights, bytes on disk
    settings: dict[str, Any] = field(
        default_factory=dict
    )  # what the answers recommend, filled in as they run
    group: Fit | None = None  # question 1 chose tensor parallelism: the fit on that group of devices

    @property
    def native(self) -> Fit:
        return self.fits[native_precision(self.device)]

    def chosen(self) -> Fit:
        """The fit the later questions size the batch from: the chosen precision on the chosen group."""
        if self.group is not None:
            return self.group
        return self.fits[self.settings.get("quantization") or native_precision(self.device)]

    @property
    def nothing_fits(self) -> bool:
        return not self.chosen().fits

    def crossover_tokens(self, precision: str) -> float:
        return crossover_tokens(self.device, precision)


def q1_fit(f: Facts) -> Answer:
    n, mem = f.native, f.device.memory_bytes
    q = "Does the model fit with headroom?"
    evidence = [
        f"{n.precision} weights {n.weight_bytes / GB:.1f} GB = {n.weight_share:.0%} of {mem / GB:.0f} GB "
        f"on {f.device.name} (limit {HEADROOM:.0%})"
    ]
    stored, size = f.checkpoint
    if stored and stored not in ("float32", "bfloat16", "float16"):
        on_disk = f" ({size / GB:.2f} GB on disk)" if size else ""
        evidence.append(
            f"the checkpoint is stored as {stored}{on_disk}: the engine keeps the formats it supports "
            "quantized as stored; the rows below are its full-precision and on-the-fly choices"
        )
    if n.pool_from_memory and f.seqs.decodes:
        evidence.append(
            f"a step needs about {n.batch_target} sequences (max_num_seqs, or fewer where decode turns "
            "compute-bound); the KV pool left over should hold them"
        )
    evidence += [
        f"{p}: weights {x.weight_bytes / GB:.1f} GB, KV pool {x.kv_pool_bytes / GB:.1f} GB = "
        f"{x.kv_tokens:,} tokens = {x.seqs_at_mean:,} sequences of the mean size"
        for p, x in f.fits.items()
        if x.fits
    ]
    precision, tp = choose_precision(f.shape, f.hf_config, f.device, f.limits, f.seqs)
    quant = precision if precision != n.precision else None
    f.settings.update(quantization=quant, tensor_parallel_size=tp * f.device.devices)
    pcie = f.device.interconnect == "pcie"
    if pcie and tp > 1:  # the extra GPUs as pipeline stages of the job's own group
        f.settings.update(tensor_parallel_size=f.device.devices, pipeline_parallel_size=tp)
    if pcie and (tp > 1 or f.device.devices > 1):
        evidence.append(
            split_traffic(f.shape, tp * f.device.devices, 2 if f.device.dtype != "float32" else 4)
        )
    if tp > 1:
        f.group = fit(f.shape, f.hf_config, f.device.group(tp), f.limits, precision, f.seqs)
    if f.nothing_fits:
        f.settings["fits"] = False
        size = tp * f.device.devices
        evidence.append(
            f"{precision} over {size} x {f.device.name}: weights {f.chosen().weight_bytes / GB:.1f} GB, "
            f"KV pool {f.chosen().kv_tokens:,} tokens"
        )
        rec = (
            f"nothing fits: not even {size} x {f.device.name} (tensor_parallel_size={size}, the largest "
            f"group considered) leaves room for a KV pool of two blocks; use GPUs with more memory, or a "
            "smaller or quantized checkpoint. No engine settings are recommended"
        )
        return Answer(1, q, "no", evidence, rec)
    if n.headroom:
        rec = (
            f"run {n.precision} weights unquantized; with more GPUs run more lanes of {f.device.name} "
            f"(data parallel, tensor_parallel_size={f.device.devices})"
        )
        if pcie and f.device.devices > 1:
            rec += (
                f"; over PCIe, pipeline_parallel_size={f.device.devices} moves far fewer bytes between the "
                "GPUs than tensor parallelism (see the evidence)"
            )
        return Answer(1, q, "yes", evidence, rec)
    why = (
        "the weights alone exceed the limit"
        if n.weight_share > HEADROOM or not n.fits
        else f"the KV pool left holds {n.seqs_at_mean} of the {n.batch_target} sequences a step needs"
    )
    how = (
        "pipeline parallelism: PCIe carries a pipeline's few activations far better than tensor "
        "parallelism's two all-reduces per layer"
        if pcie
        else "tensor parallelism"
    )
    if quant:
        rec = (
            f"{why}: quantize to {QUANT_METHODS[quant]} ({f.fits[quant].seqs_at_mean:,} sequences fit), "
            f"or shard {n.precision} weights over more GPUs ({how})"
        )
    elif pcie:
        rec = (
            f"{why}, and no quantized precision fixes it on {f.device.name}: pipeline_parallel_size={tp}"
            + (f" x tensor_parallel_size={f.device.devices}" if f.device.devices > 1 else "")
            + f" ({how})"
        )
    else:
        rec = (
            f"{why}, and no quantized precision fixes it on {f.device.name}: "
            f"tensor_parallel_size={tp * f.device.devices}"
        )
    return Answer(1, q, "no", evidence, rec)


def split_traffic(shape: ModelShape, gpus: int, dtype_bytes: int) -> str:
    """Bytes each GPU sends per token when the model spans ``gpus`` GPUs: tensor parallelism all-reduces
    the hidden state twice per layer (a ring sends 2 (n - 1) / n of it each time); a pipeline sends the
    hidden state and the residual once per stage boundary."""
    hidden = shape.hidden_size * dtype_bytes
    tp = 2 * shape.num_layers * hidden * 2 * (gpus - 1) / gpus
    pp = 2 * hidden * (gpus - 1) / gpus  # (gpus - 1) boundaries, spread over gpus senders
    return (
        f"between {gpus} GPUs over PCIe, per token: tensor parallelism sends {tp / 1024:,.0f} KiB per GPU "
        f"(2 all-reduces x {shape.num_layers} layers), a pipeline {pp / 1024:,.1f} KiB "
        f"({tp / pp:,.0f}x less); PCIe (~25 GB/s) makes TP's all-reduces the bottleneck, NVLink does not"
    )


def q2_sharing(f: Facts) -> Answer:
    s = f.sharing
    bs = s.block_size
    block_bytes = f.shape.kv_bytes_per_token(2 if f.device.dtype != "float32" else 4) * bs
    evidence = [
        f"distinct trie tokens {s.distinct_tokens:,} of {s.prompt_tokens:,} prompt tokens "
        f"({s.distinct_share:.0%}) in {s.requests:,} sampled requests",
        f"block minimum {s.block_min_tokens:,} tokens at block_size {bs}: best prefix hit rate "
        f"{s.best_hit_rate:.0%}",
    ]
    rows = max(f.workload.good_rows, 1)
    evidence += [
        f"shared head of {h.tokens:,} tokens in {h.rows:,} rows ({h.rows / rows:.0%}): {h.preview!r}"
        for h in s.heads[:3]
    ]
    if s.cache_blocks_needed:
        evidence.append(
            f"the cache must keep at least {s.cache_blocks_needed} block(s) "
            f"({s.cache_blocks_needed * block_bytes / 2**20:.1f} MiB) for the longest head to stay shared"
        )
    if f.flag:
        evidence.append(f.flag.message)
    yes = s.best_hit_rate >= SHARING_YES
    f.settings["ordering"] = "prefix" if yes else "fifo"
    f.settings["enable_prefix_caching"] = True
    if yes:
        rec = "keep enable_prefix_caching: true and ordering: prefix (the defaults)"
    else:
        rec = (
            f"little to share (below {SHARING_YES:.0%}): ordering: fifo does as well as prefix ordering; "
            "the prefix cache costs nothing and may stay on"
        )
    if f.flag:
        rec += f"; reorder the template: static text first, {{{{ {f.flag.variable} }}}} last"
    return Answer(2, "Do the requests share prompt structure?", "yes" if yes else "no", evidence, rec)


def q3_output_lengths(f: Facts) -> Answer:
    w, cfg = f.workload, f.cfg
    q = "Are output lengths variable?"
    if w.output_source == "scoring":
        return Answer(
            3,
            q,
            "no",
            ["label scoring: every request is its prompt plus one label, one step of output"],
            "nothing to batch by length; continuous batching costs nothing here",
        )
    cap = w.output_cap
    evidence = [
        f"max_tokens per row: p50 {cap.p50}, p90 {cap.p90}, max {cap.max} (spread {cap.cv:.2f})"
        if cap.n
        else "no row sets max_tokens: rows run until EOS or the context limit"
    ]
    pilot = f.workload.pilot
    if pilot is not None and pilot.output_tokens:
        d = Dist.of(pilot.output_tokens)
        evidence.append(
            f"pilot: generated p50 {d.p50}, p90 {d.p90}, max {d.max} tokens (spread {d.cv:.2f}); "
            f"finish reasons {pilot.finish_reasons}"
        )
        verdict = "yes" if d.cv >= VARIABLE_CV or cap.cv >= VARIABLE_CV else "no"
    elif cap.cv >= VARIABLE_CV or w.unbounded_rows:
        verdict = "yes"
    elif cfg.sampling.ignore_eos:
        verdict = "no"
        evidence.append("ignore_eos: every row generates exactly its max_tokens")
    else:
        verdict = "likely"
        evidence.append("rows stop at EOS before the cap at lengths only a pilot measures (--pilot N)")
    rec = {
        "yes": "continuous batching: a finished row frees its slot at once (always on in prefixflow)",
        "likely": "continuous batching (always on in prefixflow); measure the spread with --pilot N",
        "no": "equal lengths: static batching would do as well; continuous batching costs nothing",
    }[verdict]
    return Answer(3, q, verdict, evidence, rec)


def q4_fragmentation(f: Facts) -> Answer:
    x = f.chosen()
    if f.nothing_fits:
        return Answer(
            4,
            "Does KV fragmentation cap the batch?",
            "not applicable",
            [f"no KV pool fits ({x.kv_tokens:,} tokens)"],
            "nothing fits (question 1): no batch to size",
        )
    ctx = max(x.max_model_len, 1)
    contiguous = x.kv_tokens // ctx
    paged = x.seqs_at_mean
    evidence = [
        f"KV pool {x.kv_tokens:,} tokens ({x.precision} weights): reserving max_model_len {ctx:,} per "
        f"sequence (contiguous cache) fits {contiguous:,} sequences; paged, with shared heads stored once, "
        f"{paged:,} sequences of the sample's mean size fit ({x.seqs_at_p99:,} of its p99 size)",
        f"max_num_seqs {f.limits.max_num_seqs}",
    ]
    capped = contiguous < f.limits.max_num_seqs
    verdict = "yes" if capped and paged >= PAGING_GAIN * max(contiguous, 1) else "no"
    seqs = max(1, min(paged, MAX_SEQS_CAP))  # the pool holds two blocks at least (it fits): one sequence runs
    f.settings["max_num_seqs"] = seqs
    f.settings["max_model_len"] = x.max_model_len
    if verdict == "yes":
        rec = (
            f"paging (always on): max_num_seqs={seqs} uses the pool; a contiguous cache would stop at "
            f"{contiguous}"
        )
    else:
        rec = f"paging does not decide the batch here; max_num_seqs={seqs} fills the pool"
    return Answer(
        4, "Does KV fragmentation cap the batch?", verdict, evidence, rec + "; " + _host_tier(f, x, evidence)
    )


def _host_tier(f: Facts, x: Fit, evidence: list[str]) -> str:
    """The host KV tier's size (kv_offload_bytes) from the predicted working set: the deepest shared
    head the cache keeps (prefix order) plus a step's sequences at the sample's p99 size."""
    shared = f.sharing.cache_blocks_needed * f.sharing.block_size
    p99_size = x.kv_tokens / max(x.seqs_at_p99, 1)
    working = shared + int(x.batch_target * p99_size)
    per_token = x.kv_pool_bytes / x.kv_tokens if x.kv_tokens else 0.0
    host = host_memory_bytes()
    offload = recommend_offload_bytes(working, x.kv_tokens, per_token, host)
    f.settings["kv_offload_bytes"] = offload
    evidence.append(
        f"working set about {working:,} tokens (shared head {shared:,} + {x.batch_target} sequences of "
        f"the p99 size) against a pool of {x.kv_tokens:,}; host memory {host / GB:.0f} GB"
    )
    if offload:
        return (
            f"kv_offload_bytes={offload} ({offload / 2**30:.0f} GiB host tier): evicted prefixes and "
            "preempted sequences reload instead of recomputing"
        )
    return "kv_offload_bytes=0: the device pool holds the working set, a host tier would stay idle"


def q5_speculation(f: Facts) -> Answer:
    q = "Is per-token latency the metric?"
    x = f.chosen()
    cross = f.crossover_tokens(x.precision)
    evidence = ["an offline batch job is measured in rows per GPU-hour, not in seconds per token"]
    f.settings["speculative_decoding"] = False
    if f.workload.output_source == "scoring":
        return Answer(
            5,
            q,
            "not applicable",
            evidence + ["label scoring generates nothing to speculate on"],
            "no speculative decoding",
        )
    batch = min(x.seqs_at_mean, f.limits.max_num_seqs)
    evidence.append(
        f"about {batch} sequences decode together; a step turns compute-bound near {cross:.0f} "
        f"tokens ({x.precision} on {f.device.name})"
    )
    pilot = f.workload.pilot
    proposed, accepted, steps = pilot.ngram_replay if pilot is not None else (0, 0, 0)
    tokens = accepted + steps
    per_step = tokens / steps if steps else 0.0
    if steps:
        evidence.append(
            f"the pilot's outputs replayed under n-gram prompt lookup (k={REPLAY_K}): "
            f"{accepted:,} of {proposed:,} drafts accepted, {per_step:.2f} tokens per decode step"
        )
    forced_proposed, forced_accepted = pilot.forced_replay if pilot is not None else (0, 0)
    if forced_proposed:
        evidence.append(
            f"{forced_proposed:,} of those drafts were forced by the output grammar (jump-forward) and "
            f"{forced_accepted / forced_proposed:.0%} of them accepted"
        )
    if batch >= cross / 4:
        rec = (
            "no speculative decoding: at this batch the spare compute that draft tokens need is not there "
            "(speculative: {method: ngram} with num_speculative_tokens: auto would keep itself off)"
        )
        return Answer(5, q, "no", evidence, rec)
    if steps and per_step >= SPECULATION_PAYS:
        f.settings["speculative_decoding"] = True
        return Answer(
            5,
            q,
            "likely",
            evidence,
            f"speculative: {{method: ngram}}: at only {batch} sequences per step decode is bound by reading "
            f"weights, and {per_step:.2f} tokens per step would come almost for free",
        )
    if steps:
        rec = (
            f"no: at {per_step:.2f} tokens per step the lookup is rarely right on this job's outputs "
            "(a draft model might be; num_speculative_tokens: auto would keep n-gram speculation off)"
        )
    else:
        rec = (
            f"no for throughput; at only {batch} sequences per step decode is bound by reading weights, so "
            "draft tokens would be nearly free: run --pilot N to measure how often n-gram lookup would be right "
            "(speculative: {method: ngram})"
        )
    return Answer(5, q, "no", evidence, rec)


def q6_contention(f: Facts) -> Answer:
    q = "Do prefill and decode contend at scale?"
    p = f.workload.projected
    prefill, decode = p["computed_prompt_tokens"], p["output_tokens"]
    share = prefill / (prefill + decode) if prefill + decode else 0.0
    x = f.chosen()
    cross = f.crossover_tokens(x.precision)
    budget = max(4096, min(16384, 1 << max(0, int(16 * cross) - 1).bit_length()))
    f.settings["max_num_batched_tokens"] = budget
    evidence = [
        f"prefill {prefill:,} computed tokens vs decode {decode:,} ({share:.0%} prefill)",
        "disaggregation (separate prefill and decode machines) serves latency targets of online "
        "traffic; one offline job has none",
    ]
    rec = (
        f"chunked mixed steps: max_num_batched_tokens={budget} (>= 16x the {cross:.0f}-token compute "
        "crossover, so prefill chunks run at full matmul rate and decodes ride along)"
    )
    if f.workload.output_source == "scoring" or share > 0.95:
        return Answer(6, q, "no", evidence + ["almost no decode: steps are prefill only"], rec)
    if share < 0.05:
        return Answer(6, q, "no", evidence + ["almost no prefill: steps are decode only"], rec)
    return Answer(6, q, "yes", evidence, rec)


def answer_all(f: Facts) -> list[Answer]:
    return [
        q(f) for q in (q1_fit, q2_sharing, q3_output_lengths, q4_fragmentation, q5_speculation, q6_contention)
    ]

"""``--pilot N``: run N sampled rows through the real engine (this imports torch and loads the weights)
to measure what only generation shows: output lengths under EOS, prefix hits, preemptions, speed."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from prefixflow.pipeline.advisor.devices import Device
from prefixflow.pipeline.advisor.estimate import bytes_per_param, ceilings
from prefixflow.pipeline.advisor.memory import EngineLimits, native_precision
from prefixflow.pipeline.advisor.roofline import ModelShape, lower_bound_seconds
from prefixflow.pipeline.advisor.speculation import Recorder, replay
from prefixflow.pipeline.advisor.workload import PilotResult
from prefixflow.pipeline.errors import RowError
from prefixflow.pipeline.job.spec import JobSpec
from prefixflow.pipeline.storage.sample import Sample
from prefixflow.pipeline.tasks.rows import Prepared, RowPreparer


def run_pilot(spec: JobSpec, sample: Sample, n: int, llm: Any = None) -> PilotResult:
    """Generate ``n`` rows spread over the sample (nothing is written); ``llm`` reuses a loaded engine."""
    from prefixflow.pipeline.job.spec import open_engine
    from prefixflow.pipeline.tasks.inference import execute

    llm = llm or open_engine(spec)
    cfg = spec.config
    prep = RowPreparer(cfg, llm, {}, spec.task)
    step = max(1, len(sample.rows) // max(n, 1))
    prepared: dict[str, Prepared] = {}
    for s in sample.rows[::step][:n]:
        base = {"id": f"{s.relpath}#{s.row_index}"}
        try:
            prepared[base["id"]] = prep.prepare(s.row, base, s.relpath, s.row_index)
        except RowError:
            continue
    before = llm.stats().as_dict()
    start = time.perf_counter()
    recorder = Recorder(llm)  # keeps the output token ids, for the speculation replay
    records = list(execute(recorder, prep, list(prepared.values()), cfg.output.flush_rows))
    elapsed = time.perf_counter() - start
    after = llm.stats().as_dict()
    outputs, caps = [], []
    for rec in records:
        p = prepared.get(rec["id"])
        if (
            p is not None
            and p.prompt is not None
            and rec.get("finish_reason") in ("stop", "length")
            and rec.get("output_tokens")
        ):
            outputs.append(int(rec["output_tokens"]))
            caps.append(p.params.max_tokens)
    replayed = replay(llm, recorder.finished)
    return PilotResult(
        rows=len(records),
        output_tokens=outputs,
        output_caps=caps,
        finish_reasons=dict(Counter(str(r.get("finish_reason")) for r in records)),
        elapsed_s=elapsed,
        prompt_tokens=after["prompt_tokens"] - before["prompt_tokens"],
        cached_tokens=after["cached_prompt_tokens"] - before["cached_prompt_tokens"],
        generated_tokens=after["output_tokens"] - before["output_tokens"],
        preemptions=after["preemptions"] - before["preemptions"],
        device=str(getattr(getattr(llm, "config", None), "device", "")),
        requests=[
            (
                int(r["prompt_tokens"]),
                max(1, int(r["output_tokens"] or 0)),
                min(int(r["cached_tokens"] or 0), max(int(r["prompt_tokens"]) - 1, 0)),
            )
            for r in records
            if r.get("prompt_tokens")
        ],
        ngram_replay=(replayed[0], replayed[1], replayed[2]),
        forced_replay=(replayed[3], replayed[4]),
    )


def pilot_efficiency(
    pilot: PilotResult, shape: ModelShape, device: Device, limits: EngineLimits
) -> tuple[float, float, str] | None:
    """Achieved / roofline bound of the pilot on the local device, as the estimate's efficiency."""
    if not pilot.requests or pilot.elapsed_s <= 0:
        return None
    precision = native_precision(device)
    bound = lower_bound_seconds(
        shape,
        pilot.requests,
        ceilings(device, precision),
        bytes_per_param(shape, precision),
        4 if device.dtype == "float32" else 2,
        limits.max_num_batched_tokens,
        limits.max_num_seqs,
    )
    eff = bound / pilot.elapsed_s
    return eff, eff, f"measured by the pilot ({pilot.rows} rows on {device.name})"

"""Predicted versus measured, after a run: what the advisor said the job would do on this machine, next
to what the committed shards report, so the advisor's errors show (and its efficiency table can be
corrected from real runs).

``record_prediction`` runs the advisor on a small sample for the local device when a run starts and
stores the figures with the run (``OUTPUT/_predictions/<run>/prediction.json``, kept when the run
resumes); ``finalize`` and ``status`` line them up with the run's totals through ``compare``: output
tokens/s per lane, efficiency, prefix hit rate, preemptions and GPU-hours.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prefixflow.pipeline.advisor.memory import EngineLimits
from prefixflow.pipeline.job.spec import JobSpec
from prefixflow.pipeline.storage.layout import Layout
from prefixflow.pipeline.storage.shards import Shard

if TYPE_CHECKING:
    from prefixflow.pipeline.run.handle import Run

RUN_SAMPLE_ROWS = 256  # a run's prediction samples fewer rows than `plan --advise`: it costs the run time


def predict_run(
    spec: JobSpec, sample_rows: int = RUN_SAMPLE_ROWS, shards: list[Shard] | None = None
) -> dict[str, Any]:
    """The figures a run is later compared with, for the local device (torch-free, like the advisor).
    ``shards``: the run's plan (planned again when not given)."""
    from prefixflow.pipeline.advisor.advise import advise

    advice = advise(spec, gpu="local", sample_size=sample_rows, shards=shards)
    e = advice.estimates[0]
    fit = advice.fits[e.precision] if e.precision in advice.fits else next(iter(advice.fits.values()))
    requests = len(advice.workload.requests)
    per_shard = requests / max(advice.workload.sampled_rows, 1) * spec.config.output.shard_rows
    # the run uses the job's own settings, not the advice: as many sequences as its max_num_seqs admits
    concurrent = min(EngineLimits.from_engine(spec.config.engine).max_num_seqs, per_shard)
    return {
        "device": e.device,
        "precision": e.precision,
        "devices_per_lane": e.devices_per_lane,
        "sample_rows": advice.workload.sampled_rows,
        "rows": advice.workload.total_rows,
        "output_tokens": e.output_tokens,
        "lower_bound_s": e.lower_bound_s,
        "expected_s": list(e.expected_s),
        "bound_output_tokens_per_s": e.output_tokens / e.lower_bound_s if e.lower_bound_s else 0.0,
        "output_tokens_per_s": list(e.output_tokens_per_s),
        "gpu_hours": list(e.gpu_hours_expected),
        "efficiency": list(e.efficiency),
        "efficiency_source": e.efficiency_source,
        "prefix_hit_rate": advice.sharing.best_hit_rate,
        # every running sequence at its 99th-percentile size fits the pool: no preemption expected
        "preemptions": 0 if fit.seqs_at_p99 >= concurrent else None,
    }


def _verdict(measured: float, lo: float, hi: float) -> str:
    if measured < lo:
        return f"below the range ({measured / lo:.2f}x its low end)" if lo else "below"
    if measured > hi:
        return f"above the range ({measured / hi:.2f}x its high end)" if hi else "above"
    return "within the range"


def compare(prediction: dict[str, Any], measured: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of (metric, predicted, measured, verdict). ``measured`` is a RunSummary.as_dict() (plus
    ``preemptions`` when known). GPU-hours are projected to the whole input when the run is partial."""
    rows: list[dict[str, Any]] = []
    lo, hi = prediction["output_tokens_per_s"]
    bound = prediction["bound_output_tokens_per_s"]
    tps = float(measured.get("output_tokens_per_s") or 0.0)
    if measured.get("output_tokens"):
        rows.append(
            {
                "metric": "output tok/s per lane",
                "predicted": f"{lo:,.1f}-{hi:,.1f} (bound {bound:,.1f})",
                "measured": round(tps, 2),
                "verdict": _verdict(tps, lo, hi),
            }
        )
        rows.append(
            {
                "metric": "efficiency (measured / bound)",
                "predicted": "{:.2f}-{:.2f}".format(*prediction["efficiency"]),
                "measured": round(tps / bound, 4) if bound else None,
                "verdict": prediction["efficiency_source"],
            }
        )
    hit = float(measured.get("prefix_hit_rate") or 0.0)
    rows.append(
        {
            "metric": "prefix hit rate",
            "predicted": round(prediction["prefix_hit_rate"], 4),
            "measured": round(hit, 4),
            "verdict": f"{hit - prediction['prefix_hit_rate']:+.1%}",
        }
    )
    if measured.get("preemptions") is not None:
        want = prediction["preemptions"]
        got = int(measured["preemptions"])
        rows.append(
            {
                "metric": "preemptions",
                "predicted": "none" if want == 0 else "possible",
                "measured": got,
                "verdict": "as predicted" if (got == 0) == (want == 0) else "not as predicted",
            }
        )
    done, total = int(measured.get("rows") or 0), int(prediction.get("rows") or 0)
    if done and total:
        hours = (
            float(measured.get("elapsed_s") or 0.0)
            * prediction.get("devices_per_lane", 1)
            / 3600
            * total
            / done
        )
        g_lo, g_hi = prediction["gpu_hours"]
        note = "" if done >= total else f" (projected from {done:,} of {total:,} rows)"
        rows.append(
            {
                "metric": f"{'GPU' if prediction['device'] != 'cpu' else 'device'}-hours, whole input",
                "predicted": f"{g_lo:.3g}-{g_hi:.3g}",
                "measured": float(f"{hours:.3g}"),
                "verdict": _verdict(hours, g_lo, g_hi) + note,
            }
        )
    return rows


def record_prediction(
    run: Run, shards: list[Shard] | None = None, warn: Callable[[str], None] | None = None
) -> None:
    """Predict the run once (a resumed run keeps its first prediction). Never fails the run:
    a prediction that cannot be made is reported through ``warn`` and the run goes on without it.
    ``shards``: the run's plan, so the advisor does not plan the input again."""
    try:
        layout = run.layout
        if layout.prediction in run.files.paths:
            return
        prediction = predict_run(run.spec, shards=shards)
        layout.store.write_atomic(
            layout.prediction, json.dumps(prediction, indent=1, sort_keys=True).encode()
        )
    except Exception as exc:  # the advice is a by-product: the rows matter more
        if warn is not None:
            warn(f"no prediction for this run ({type(exc).__name__}: {exc}); the summary will not compare")


def read_prediction(layout: Layout) -> dict[str, Any] | None:
    """The run's stored prediction, or None (none made, or unreadable)."""
    try:
        if not layout.store.exists(layout.prediction):
            return None
        data = json.loads(layout.store.read_bytes(layout.prediction))
    except Exception:
        return None
    return data if isinstance(data, dict) else None

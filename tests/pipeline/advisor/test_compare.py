"""Predicted versus measured: the comparison rows say where the advisor was right and where it was not."""

from __future__ import annotations

from prefixflow.pipeline.advisor.compare import compare

PREDICTION = {
    "device": "cpu",
    "precision": "fp32",
    "devices_per_lane": 1,
    "rows": 1000,
    "output_tokens": 8000,
    "lower_bound_s": 10.0,
    "expected_s": [50.0, 200.0],
    "bound_output_tokens_per_s": 800.0,
    "output_tokens_per_s": [40.0, 160.0],
    "gpu_hours": [50 / 3600, 200 / 3600],
    "efficiency": [0.05, 0.2],
    "efficiency_source": "measured on the CPU",
    "prefix_hit_rate": 0.5,
    "preemptions": 0,
}


def _rows(measured: dict) -> dict[str, dict]:
    return {r["metric"]: r for r in compare(PREDICTION, measured)}


def test_a_run_inside_the_predicted_range() -> None:
    rows = _rows(
        {
            "output_tokens": 8000,
            "output_tokens_per_s": 100.0,
            "prefix_hit_rate": 0.48,
            "rows": 1000,
            "elapsed_s": 80.0,
            "preemptions": 0,
        }
    )
    assert rows["output tok/s per lane"]["verdict"] == "within the range"
    assert rows["efficiency (measured / bound)"]["measured"] == 0.125
    assert rows["prefix hit rate"]["verdict"] == "-2.0%"
    assert rows["preemptions"]["verdict"] == "as predicted"
    hours = rows["device-hours, whole input"]
    assert hours["measured"] == float(f"{80 / 3600:.3g}") and hours["verdict"] == "within the range"


def test_a_slow_partial_run_is_projected_and_flagged() -> None:
    rows = _rows(
        {
            "output_tokens": 2000,
            "output_tokens_per_s": 10.0,
            "prefix_hit_rate": 0.5,
            "rows": 250,
            "elapsed_s": 200.0,
            "preemptions": 3,
        }
    )
    assert rows["output tok/s per lane"]["verdict"] == "below the range (0.25x its low end)"
    assert rows["preemptions"]["verdict"] == "not as predicted"
    hours = rows["device-hours, whole input"]
    assert hours["measured"] == float(f"{800 / 3600:.3g}")  # 200 s for a quarter of the rows
    assert "projected from 250 of 1,000 rows" in hours["verdict"]


def test_unknown_preemptions_and_no_output_leave_rows_out() -> None:
    rows = _rows({"output_tokens": 0, "prefix_hit_rate": 0.5, "rows": 0, "elapsed_s": 0.0})
    assert set(rows) == {"prefix hit rate"}

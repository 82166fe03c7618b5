"""A label job through the batch_inference flow: a label collapse reaches the run-summary artifact."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.flows.support import JOB, delete_limit, read_artifacts, requires_pipeline

pytestmark = [requires_pipeline, pytest.mark.timeout(300)]

# Uncalibrated, a one-token label beats a six-token one on every row of the random tiny model.
LABEL_JOB = {
    "task": "label",
    "id_column": "id",
    "template": "Item: {{ prompt }}",
    "chat": "off",
    "label": {"labels": ["yes", "yes yes yes yes yes yes"], "calibration": "none", "case_variants": False},
    "engine": JOB["engine"],
}


def test_label_collapse_reaches_the_summary_artifact(prefect_server: str, tmp_path: Path) -> None:
    from prefixflow.flows import batch_inference

    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    ids = [f"r{i:02d}" for i in range(30)]
    pq.write_table(
        pa.table({"id": ids, "prompt": [f"thing number {i}" for i in range(30)]}), inp / "a.parquet"
    )
    delete_limit("prefixflow-cpu")
    state = batch_inference(
        input=str(inp),
        output=str(out),
        model="tiny",
        job=LABEL_JOB,
        shard_rows=10,
        lanes=1,
        retry_delay_s=0.0,
        progress_poll_s=0.5,
        return_state=True,
    )
    assert state.is_completed(), state.message
    arts = asyncio.run(read_artifacts(state.state_details.flow_run_id))
    art = arts["prefixflow-run-summary"]
    summary = {row["metric"]: row["value"] for row in json.loads(art.data)}
    assert summary["label_counts[yes]"] == 30
    assert "'yes' is 100% of the committed labeled rows (30 of 30)" in summary["label_warning"]
    assert art.description.startswith("WARNING: label collapse: 'yes' is 100%")
    labels = arts[
        "prefixflow-labels"
    ].data  # issue 26: the label report, before/after calibration, inline SVG
    assert "| yes | 30 | 30 |" in labels and "data:image/svg+xml;base64," in labels

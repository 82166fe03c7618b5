"""Batch calibration (issue 26): the label prior estimated from a sample of the job's own rows, stored
once per run, applied to every row; checked against a hand computation from the engine's own scores,
across a kill and resume, and on a sample that cannot estimate anything (identical rows)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import polars as pl
import pytest
import yaml
from rich.console import Console

from prefixflow.pipeline import load_job, status
from prefixflow.pipeline.local_run import print_summary, run_local
from prefixflow.pipeline.tasks.label.scoring import batch_bias, calibrated_probs
from tests.pipeline.support import job, write_dataset, write_parquet
from tests.pipeline.test_kill import _command, _committed, _run_until

LABELS = ("positive", "negative", "neutral")
TEMPLATE = "Review: {{ text }}\nVerdict:"
ROW_COLUMNS = ["id", "label", "label_probs", "label_logprobs_raw", "finish_reason", "error"]


def _softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    w = [math.exp(x - top) for x in xs]
    return [v / sum(w) for v in w]


def test_batch_bias_matches_a_hand_computation_on_a_fixed_score_table() -> None:
    """Two labels, three rows: the prior is each label's mean softmax probability, in log space."""
    table = [
        [0.0, math.log(3)],
        [math.log(3), 0.0],
        [0.0, 0.0],
    ]  # softmax: (1/4, 3/4), (3/4, 1/4), (1/2, 1/2)
    assert batch_bias(table, None) == pytest.approx([math.log(0.5), math.log(0.5)])  # already balanced
    skewed = [[0.0, math.log(9)], [0.0, math.log(9)], [math.log(9), 0.0]]  # (.1,.9), (.1,.9), (.9,.1)
    prior = [(0.1 + 0.1 + 0.9) / 3, (0.9 + 0.9 + 0.1) / 3]
    assert batch_bias(skewed, None) == pytest.approx([math.log(p) for p in prior])
    corrected = calibrated_probs(skewed[0], batch_bias(skewed, None))
    want = _softmax([0.0 - math.log(prior[0]), math.log(9) - math.log(prior[1])])
    assert corrected == pytest.approx(want)
    base = [math.log(0.2), math.log(0.8)]  # batch on top of contextual: the prior of the corrected rows
    mid = [_softmax([s - b for s, b in zip(row, base)]) for row in skewed]
    both = [base[k] + math.log(sum(m[k] for m in mid) / 3) for k in range(2)]
    assert batch_bias(skewed, base) == pytest.approx(both)


def _rows(n: int) -> list[dict]:
    words = ["great", "awful", "fine", "broken", "lovely", "slow", "cheap", "solid", "noisy", "bright"]
    return [{"id": f"r{i}", "text": f"{words[i % 10]} {words[(i * 3 + 1) % 10]} item {i}"} for i in range(n)]


def _per_label(llm, prompt: str) -> list[float]:
    """Each label's log-score from the engine's raw choice scores (case variants summed), by hand."""
    tok = llm.tokenizer
    forms = [[" " + lb, " " + lb.capitalize()] for lb in LABELS]
    flat = [f for fs in forms for f in fs]
    scores = dict(zip(flat, llm.score_choices([tok.encode(prompt)], [flat])[0]))
    return [math.log(sum(math.exp(scores[f]) for f in fs)) for fs in forms]


@pytest.mark.parametrize("method", ["batch", "batch+contextual"])
def test_label_probs_are_the_batch_calibrated_engine_scores(tmp_path: Path, tiny_llm, method: str) -> None:
    rows = _rows(30)  # >= 8 x 3 labels, all distinct; fewer than calibration_rows, so the sample is every row
    write_parquet(tmp_path / "in" / "rows.parquet", rows)
    cfg = job(
        "label", chat="off", template=TEMPLATE, label={"calibration": method}, output={"shard_rows": 10}
    )
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    assert failures == [] and summary.complete
    raw = [_per_label(tiny_llm, f"Review: {r['text']}\nVerdict:") for r in rows]
    base = None
    if method == "batch+contextual":
        refs = [_softmax(_per_label(tiny_llm, f"Review: {v}\nVerdict:")) for v in ("N/A", "[MASK]")]
        base = [math.log((refs[0][k] + refs[1][k]) / 2) for k in range(3)]
    shifted = [_softmax([s - (base[k] if base else 0.0) for k, s in enumerate(r)]) for r in raw]
    prior = [sum(d[k] for d in shifted) / len(rows) for k in range(3)]
    df = pl.read_parquet(summary.data_glob).sort("row_index")
    for row, scores in zip(df.to_dicts(), raw):
        bias = [math.log(prior[k]) + (base[k] if base else 0.0) for k in range(3)]
        want = dict(zip(LABELS, _softmax([s - b for s, b in zip(scores, bias)])))
        assert row["label_probs"] == pytest.approx(want, abs=1e-6)
        assert row["label_logprobs_raw"] == pytest.approx(dict(zip(LABELS, scores)), abs=1e-6)
        assert row["label"] == max(want, key=want.get)
    cal = summary.label_calibration
    assert cal["applied"] == method and cal["fallback"] is None and cal["sample_rows"] == len(rows)
    assert cal["prior"] == pytest.approx(dict(zip(LABELS, prior)), abs=1e-6)
    assert cal["prompt_tokens"] == sum(
        len(tiny_llm.tokenizer.encode(f"Review: {r['text']}\nVerdict:")) for r in rows
    )
    before = [LABELS[max(range(3), key=lambda k: r[k])] for r in raw]
    assert summary.label_counts_raw == {lb: before.count(lb) for lb in LABELS if before.count(lb)}


def test_a_lane_without_a_plan_time_prior_plans_every_shard_for_it(tmp_path: Path, tiny_llm) -> None:
    """run_shards (a flow lane's loop) over one shard of three, no prior stored: the task plans the run's
    shards itself (the planner the loop hands it), so the prior is the one run_local makes at plan time."""
    from prefixflow.pipeline import plan_shards, prepare_run, run_shards

    write_parquet(tmp_path / "in" / "rows.parquet", _rows(30))
    cfg = job(
        "label", chat="off", template=TEMPLATE, label={"calibration": "batch"}, output={"shard_rows": 10}
    )
    whole = load_job(str(tmp_path / "in"), str(tmp_path / "whole"), "tiny", cfg)
    reference, _ = run_local(whole, llm=tiny_llm, progress=False)
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "lane"), "tiny", cfg)
    shards = plan_shards(spec)
    assert len(shards) == 3
    run = prepare_run(spec, shards=shards)
    assert not run.layout.store.exists(run.layout.label_prior)
    (outcome,) = list(run_shards(run, shards[:1], tiny_llm))
    assert outcome.error is None
    prior = json.loads(run.layout.store.read_bytes(run.layout.label_prior))
    assert prior["sample_rows"] == 30  # every row of every shard, not only this lane's 10
    assert prior["prior"] == pytest.approx(reference.label_calibration["prior"], abs=1e-9)


@pytest.mark.slow  # two subprocess runs of the CLI (~50 s)
def test_resume_after_a_kill_writes_the_bits_of_an_uninterrupted_run(tmp_path: Path) -> None:
    ids = write_dataset(tmp_path / "in", files=2, rows_per_file=20, row_group_size=5)  # 40 distinct rows
    cfg = job("label", chat="off", template=TEMPLATE, output={"shard_rows": 10, "flush_rows": 3})
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(cfg))
    reference, _ = run_local(
        load_job(str(tmp_path / "in"), str(tmp_path / "ref"), "tiny", str(job_file)),
        progress=False,
    )  # its own engine, as the CLI's: label jobs score batch-invariantly on the CPU
    ref_prior = json.loads(next(Path(tmp_path / "ref", "_calibration").rglob("label_prior.json")).read_text())
    assert ref_prior["applied"] == "batch+contextual" and ref_prior["sample_rows"] == 40
    out = str(tmp_path / "out")
    cmd = _command(tmp_path / "in", out, job_file, None)
    assert _run_until(cmd, "flush_end", 7)  # killed inside the second shard, the estimate stored
    stored_path = next(Path(out, "_calibration").rglob("label_prior.json"))
    stored = stored_path.read_bytes()
    assert 0 < _committed(out, None).height < len(ids)
    _run_until(cmd, None, 0)
    assert stored_path.read_bytes() == stored  # never re-estimated
    prior = json.loads(stored)
    assert prior["bias"] == ref_prior["bias"] and prior["digest"] != ""
    got = _committed(out, None).sort("row_index", "source_file").select(ROW_COLUMNS)
    want = pl.read_parquet(reference.data_glob).sort("row_index", "source_file").select(ROW_COLUMNS)
    assert sorted(got["id"].to_list()) == sorted(ids)
    assert got["label"].to_list() == want["label"].to_list()
    # The correction is the stored one, bit for bit, and the rows' own scores are too: the engine scores
    # batch-invariantly (EngineConfig.batch_invariant, the label task's CPU default), so the resumed
    # shard's remaining rows, batched differently, get the bits an uninterrupted run gave them.
    assert got.to_dicts() == want.to_dicts()


def test_a_tampered_estimate_is_refused_on_resume(tmp_path: Path, tiny_llm) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=30, row_group_size=5)
    cfg = job("label", chat="off", template=TEMPLATE)
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    run_local(spec, llm=tiny_llm, progress=False)
    path = next(Path(tmp_path / "out", "_calibration").rglob("label_prior.json"))
    data = json.loads(path.read_text())
    data["bias"][0] += 1.0
    path.write_text(json.dumps(data))
    for marker in Path(tmp_path / "out", "_commits").rglob("*.json"):
        marker.unlink()  # the shards must be scored again, with the (tampered) stored estimate
    from prefixflow.pipeline.errors import OutputStateError

    with pytest.raises(OutputStateError, match="does not belong to run"):
        run_local(spec, llm=tiny_llm, progress=False)


def test_identical_sample_rows_fall_back_to_contextual_and_say_so(tmp_path: Path, tiny_llm) -> None:
    rows = [{"id": f"r{i}", "text": "the same review"} for i in range(30)]
    write_parquet(tmp_path / "in" / "rows.parquet", rows)
    cfg = job("label", chat="off", template=TEMPLATE)
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    stream = io.StringIO()
    console = Console(file=stream, width=400)
    summary, failures = run_local(spec, llm=tiny_llm, progress=False, console=console)
    assert failures == [] and summary.error_rows == 0
    cal = summary.label_calibration
    assert cal["method"] == "batch+contextual" and cal["applied"] == "contextual" and cal["prior"] == {}
    assert "all 30 sampled rows have the same prompt" in cal["fallback"]
    assert "contextual calibration is used instead" in stream.getvalue()
    refs = [_softmax(_per_label(tiny_llm, f"Review: {v}\nVerdict:")) for v in ("N/A", "[MASK]")]
    base = [math.log((refs[0][k] + refs[1][k]) / 2) for k in range(3)]
    raw = _per_label(tiny_llm, "Review: the same review\nVerdict:")
    want = dict(zip(LABELS, _softmax([s - b for s, b in zip(raw, base)])))
    for row in pl.read_parquet(summary.data_glob).to_dicts():
        assert row["label_probs"] == pytest.approx(want, abs=1e-6)
    print_summary(console, summary)
    assert "fell back" in stream.getvalue()
    again, _ = status(str(tmp_path / "out"))
    assert again.label_calibration == cal


def test_a_small_sample_falls_back_and_a_gold_column_is_reported(tmp_path: Path, tiny_llm) -> None:
    rows = [
        {"id": f"r{i}", "text": t, "truth": LABELS[i % 3]} for i, t in enumerate(["good", "bad", "meh"] * 4)
    ]
    write_parquet(tmp_path / "in" / "rows.parquet", rows)
    cfg = job("label", chat="off", template=TEMPLATE, label={"gold_column": "truth"})
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    summary, _ = run_local(spec, llm=tiny_llm, progress=False)
    assert "3 distinct scorable rows, fewer than 8 x 3 labels = 24" in summary.label_calibration["fallback"]
    df = pl.read_parquet(summary.data_glob).sort("row_index")
    assert df["label_gold"].to_list() == [r["truth"] for r in rows]
    q = summary.label_quality["calibrated"]
    pred, gold = df["label"].to_list(), df["label_gold"].to_list()
    assert q["rows"] == 12 and q["accuracy"] == pytest.approx(sum(p == g for p, g in zip(pred, gold)) / 12)
    assert q["confusion"] == [
        [sum(g == t and p == c for p, g in zip(pred, gold)) for c in LABELS] for t in LABELS
    ]
    assert summary.label_quality["raw"]["rows"] == 12
    svg = Path(tmp_path / "out" / "_labels.svg").read_text()
    assert "confusion (rows: gold" in svg and "before (raw scores)" in svg

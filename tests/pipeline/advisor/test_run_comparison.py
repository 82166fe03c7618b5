"""After a run, the summary sets the advisor's prediction (made when the run started) beside what the run
measured: tokens/s, prefix hit rate, preemptions, device-hours."""

from __future__ import annotations

import json

from prefixflow.engine import LLM
from prefixflow.pipeline.advisor.compare import read_prediction, record_prediction
from prefixflow.pipeline.job.spec import load_job
from prefixflow.pipeline.local_run import print_summary, run_local
from prefixflow.pipeline.report.summary import status
from prefixflow.pipeline.run.handle import open_run
from tests.pipeline.advisor.support import unique_texts, write_rows
from tests.pipeline.support import ENGINE, job


def test_a_run_is_compared_with_its_prediction(tmp_path, tiny_llm, capsys) -> None:
    folder = write_rows(tmp_path / "in", [{"id": f"r{i}", "text": t} for i, t in enumerate(unique_texts(20))])
    spec = load_job(folder, str(tmp_path / "out"), "tiny", job("generate"))
    summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    assert not failures and summary.complete
    layout = open_run(spec).layout
    prediction = read_prediction(layout)
    assert prediction is not None and prediction["rows"] == 20 and prediction["device"] == "cpu"
    rows = {r["metric"]: r for r in summary.predicted_vs_measured}
    assert rows["prefix hit rate"]["measured"] == round(summary.prefix_hit_rate, 4)
    assert rows["prefix hit rate"]["predicted"] == round(prediction["prefix_hit_rate"], 4)
    assert rows["output tok/s per lane"]["measured"] == round(summary.output_tokens_per_s, 2)
    assert rows["preemptions"]["measured"] == summary.preemptions == 0
    assert rows["device-hours, whole input"]["measured"] == float(f"{summary.elapsed_s / 3600:.3g}")
    # status reads the same comparison back from the output alone, and the JSON summary carries it
    again, _ = status(spec.output)
    assert again.predicted_vs_measured == summary.predicted_vs_measured
    assert json.loads(json.dumps(summary.as_dict()))["predicted_vs_measured"] == summary.predicted_vs_measured
    print_summary(__import__("rich.console").console.Console(stderr=True, width=120), summary)
    assert "predicted vs measured (plan --advise)" in capsys.readouterr().err


def test_a_resumed_run_keeps_its_first_prediction(tmp_path, tiny_llm) -> None:
    folder = write_rows(tmp_path / "in", [{"id": f"r{i}", "text": t} for i, t in enumerate(unique_texts(12))])
    spec = load_job(folder, str(tmp_path / "out"), "tiny", job("generate"))
    run_local(spec, llm=tiny_llm, progress=False)
    layout = open_run(spec).layout
    layout.store.write_atomic(
        layout.prediction, json.dumps({**read_prediction(layout), "rows": 999}).encode()
    )
    record_prediction(open_run(spec))
    assert read_prediction(layout)["rows"] == 999


def test_preemptions_are_counted_per_shard_and_compared(tmp_path) -> None:
    folder = write_rows(
        tmp_path / "in", [{"id": f"r{i}", "text": t} for i, t in enumerate(unique_texts(8, words=3))], files=1
    )
    engine = {
        **ENGINE,
        "num_kv_blocks": 16,
    }  # admits several ~20-token prompts, too few blocks for all to finish
    spec = load_job(
        folder,
        str(tmp_path / "out"),
        "tiny",
        job("generate", chat="off", sampling={"max_tokens": 120, "ignore_eos": True}, engine=engine),
    )
    llm = LLM(model="tiny", **engine)
    summary, failures = run_local(spec, llm=llm, progress=False)
    assert not failures and summary.preemptions == llm.stats().preemptions > 0
    rows = {r["metric"]: r for r in summary.predicted_vs_measured}
    assert rows["preemptions"] == {
        "metric": "preemptions",
        "predicted": "possible",
        "measured": summary.preemptions,
        "verdict": "as predicted",
    }


def test_a_prediction_that_fails_never_fails_the_run(tmp_path, tiny_llm, monkeypatch) -> None:
    from prefixflow.pipeline.advisor import compare

    def broken(*_a, **_k):
        raise RuntimeError("no tokenizer today")

    monkeypatch.setattr(compare, "predict_run", broken)
    folder = write_rows(tmp_path / "in", [{"id": f"r{i}", "text": t} for i, t in enumerate(unique_texts(6))])
    spec = load_job(folder, str(tmp_path / "out"), "tiny", job("generate"))
    warnings: list[str] = []
    from prefixflow.pipeline.run.handle import prepare_run

    record_prediction(prepare_run(spec), warn=warnings.append)
    assert warnings == [
        "no prediction for this run (RuntimeError: no tokenizer today); the summary will not compare"
    ]
    summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    assert not failures and summary.complete and summary.predicted_vs_measured == []

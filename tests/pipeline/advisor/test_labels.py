"""plan --advise on a label job (issue 26): the batch-calibration sample's cost, and labels whose first
token is the same (they compete unfairly under mode: constrained)."""

from __future__ import annotations

import io

from rich.console import Console

from prefixflow.engine import inspect_model
from prefixflow.pipeline.advisor.advise import advise
from prefixflow.pipeline.advisor.report import print_advice
from prefixflow.pipeline.job.spec import load_job
from tests.pipeline.advisor.support import unique_texts, write_rows

LABELS = ["yes", "yes please", "no"]


def _job(**label) -> dict:
    return {
        "task": "label",
        "id_column": "id",
        "chat": "off",
        "template": "Answer: {{ text }}\nReply:",
        "label": {"labels": LABELS, **label},
    }


def test_label_advice_costs_the_batch_sample_and_flags_shared_first_tokens(tmp_path) -> None:
    texts = unique_texts(50)
    folder = write_rows(tmp_path / "in", [{"id": f"r{i}", "text": t} for i, t in enumerate(texts)])
    advice = advise(load_job(folder, "", "tiny", _job(calibration_rows=40, case_variants=False)), gpu="h200")
    lab = advice.labels
    tok = inspect_model("tiny").tokenizer
    firsts = {lb: tok.encode(" " + lb, add_special_tokens=False)[0] for lb in LABELS}
    assert firsts["yes"] == firsts["yes please"] != firsts["no"]  # the oracle: the tokenizer itself
    groups = [set(g["labels"]) for g in lab["shared_first_tokens"]]
    assert {"yes", "yes please"} in groups and not any("no" in g for g in groups)
    prompts = [len(tok.encode(f"Answer: {t}\nReply:")) for t in texts]
    sample = lab["batch_sample"]
    assert sample["rows"] == 40 and not sample["fallback_expected"]
    assert sample["prompt_tokens"] == round(sum(prompts) / len(prompts) * 40)
    assert sample["scoring_requests"] == 40 * 3
    out = io.StringIO()
    print_advice(Console(file=out, width=300), advice)
    text = out.getvalue()
    assert "batch calibration scores 40 sampled rows" in text and "unfair under mode: constrained" in text
    assert advice.as_dict()["labels"] == lab


def test_constrained_mode_flags_and_a_small_input_expects_the_fallback(tmp_path) -> None:
    folder = write_rows(tmp_path / "in", [{"id": f"r{i}", "text": t} for i, t in enumerate(unique_texts(10))])
    constrained = advise(load_job(folder, "", "tiny", _job(mode="constrained")), gpu="h200").labels
    # constrained mode is calibrated too, on the labels' first tokens: one scoring request per distinct
    # first token (" negative" and " neutral" share one on the tiny tokenizer), and the shared ones flagged
    assert constrained["calibration"] == "batch+contextual"
    assert constrained["batch_sample"]["scoring_requests"] == 10 * 2
    assert any("compete unfairly" in n and "correct them together" in n for n in constrained["notes"])
    small = advise(load_job(folder, "", "tiny", _job()), gpu="h200").labels
    assert small["batch_sample"]["fallback_expected"] and small["batch_sample"]["rows"] == 10
    assert any("fall back to contextual" in n for n in small["notes"])

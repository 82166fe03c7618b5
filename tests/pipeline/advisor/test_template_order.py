"""Templates that put row content before static text are flagged, naming the variable; others are not."""

from __future__ import annotations

from prefixflow.pipeline.advisor.advise import advise
from prefixflow.pipeline.advisor.template_order import check_column, check_template
from prefixflow.pipeline.job.spec import load_job
from tests.pipeline.advisor.support import instruction, unique_texts, write_rows


def words(text: str) -> int:
    return len(text.split())


ROWS = [{"text": t, "category": ["a", "b", "c"][i % 3]} for i, t in enumerate(unique_texts(40))]
LONG = instruction(40)


def test_variable_before_static_text_is_flagged_by_name() -> None:
    flag = check_template("Review: {{ text }}\n\n" + LONG, ROWS, words, 16)
    assert flag is not None and flag.variable == "text"
    assert flag.static_tokens_after == 40 and flag.static_tokens_before == 1
    assert "{{ text }}" in flag.message and "40 distinct values" in flag.message


def test_static_text_first_is_not_flagged() -> None:
    assert check_template(LONG + "\n\nReview: {{ text }}\nAnswer:", ROWS, words, 16) is None


def test_a_low_cardinality_variable_first_only_splits_sharing() -> None:
    assert check_template("[{{ category }}] " + LONG + " {{ text }}", ROWS, words, 16) is None


def test_a_short_static_tail_is_not_worth_a_flag() -> None:
    assert check_template("{{ text }}\nAnswer in one word.", ROWS, words, 16) is None


def test_control_blocks_count_as_row_content() -> None:
    flag = check_template("{% if text %}{{ text }}{% endif %} " + LONG, ROWS, words, 16)
    assert flag is not None and flag.variable == "text"


def test_prompt_column_with_a_shared_ending() -> None:
    values = [f"{r['text']} {LONG}" for r in ROWS]
    flag = check_column("prompt", values, words, 16)
    assert flag is not None and flag.variable == "prompt" and flag.static_tokens_after >= 40
    assert check_column("prompt", [f"{LONG} {r['text']}" for r in ROWS], words, 16) is None


def test_the_advice_reports_the_flag_under_question_2(tmp_path) -> None:
    folder = write_rows(tmp_path / "in", ROWS)
    job = {
        "task": "generate",
        "template": "{{ text }}\n\n" + instruction(200),
        "chat": "off",
        "sampling": {"max_tokens": 8},
    }
    advice = advise(load_job(folder, "", "tiny", job), gpu="h200")
    q2 = next(a for a in advice.answers if a.number == 2)
    assert advice.flag is not None and advice.flag.variable == "text"
    assert "{{ text }} last" in q2.recommendation
    assert any("{{ text }}" in e for e in q2.evidence)

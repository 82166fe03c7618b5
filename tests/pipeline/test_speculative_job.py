"""Speculation in a job: `speculative:` in the YAML, the --speculative-* flags and the flow parameters
set the engine's speculative_config; it stays out of the fingerprint (outputs do not change), and a
run's summary reports what was proposed and accepted."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from prefixflow.pipeline import load_job
from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import write_dataset


def test_yaml_section_and_flags_set_the_engine_option() -> None:
    from prefixflow.pipeline.cli import build_parser
    from prefixflow.pipeline.job.flags import overrides_from_args

    spec = load_job("i", "o", "tiny", {"speculative": {"method": "ngram", "num_speculative_tokens": 3}})
    assert spec.config.engine == {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}
    args = build_parser().parse_args(
        [
            "run",
            "--input",
            "i",
            "--output",
            "o",
            "--speculative-method",
            "ngram",
            "--num-speculative-tokens",
            "auto",
        ]
    )
    flagged = load_job("i", "o", "tiny", None, **overrides_from_args(args))
    assert flagged.config.engine == {
        "speculative_config": {"method": "ngram", "num_speculative_tokens": "auto"}
    }
    plain = load_job("i", "o", "tiny", None)
    assert flagged.fingerprint() == plain.fingerprint()  # the same outputs: a resume may turn it on or off


@pytest.mark.parametrize(
    "job, message",
    [
        ({"speculative": {"method": "lookahead"}}, "method='lookahead' is invalid"),
        ({"speculative": {"method": "ngram", "num_speculative_tokens": -1}}, "num_speculative_tokens=-1"),
        ({"speculative": "ngram"}, "expected a mapping"),
        (
            {"speculative": {"method": "ngram"}, "engine": {"speculative_config": {"method": "ngram"}}},
            "not both",
        ),
    ],
)
def test_bad_speculative_sections_fail_at_load(job, message) -> None:
    with pytest.raises(JobConfigError, match=message):
        load_job("i", "o", "tiny", job)


def test_bad_flag_value_is_refused() -> None:
    from prefixflow.pipeline.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["run", "--input", "i", "--output", "o", "--num-speculative-tokens", "lots"]
        )


def test_run_summary_reports_acceptance_and_outputs_match(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=6)
    common = dict(
        prompt_column="text", id_column="id", max_tokens=24, shard_rows=3, engine={"num_kv_blocks": 512}
    )
    spec = load_job(
        str(tmp_path / "in"),
        str(tmp_path / "on"),
        "tiny",
        None,
        speculative_method="ngram",
        num_speculative_tokens=3,
        **common,
    )
    summary = run_local(spec, progress=False)[0].as_dict()
    ngram = summary["speculation"]["ngram"]
    assert ngram["proposed"] > 0 and ngram["runs"] > 0
    assert ngram["acceptance_rate"] == pytest.approx(ngram["accepted"] / ngram["proposed"], abs=1e-4)
    off = load_job(str(tmp_path / "in"), str(tmp_path / "off"), "tiny", None, **common)
    assert run_local(off, progress=False)[0].as_dict()["speculation"] == {}
    a = pl.read_parquet(str(tmp_path / "on" / "data" / "**" / "*.parquet")).sort("id")
    b = pl.read_parquet(str(tmp_path / "off" / "data" / "**" / "*.parquet")).sort("id")
    assert a["output"].to_list() == b["output"].to_list()


def test_replay_counts_what_verification_would_accept() -> None:
    from prefixflow.engine import SpeculationReplay

    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    copied = [1, 2, 3, 4, 5, 6, 7, 8]  # the output quotes the prompt: after "1 2" every draft is right
    r = SpeculationReplay()
    r.add(prompt, copied)
    c = r.counts
    assert c.accepted == c.proposed > 0 and c.steps < len(copied)
    assert c.accepted + c.steps == len(copied)  # every step emits its accepted drafts plus one token
    fresh = [40, 41, 42, 43, 44, 45]  # nothing to look up
    r = SpeculationReplay()
    r.add(prompt, fresh)
    assert (r.counts.proposed, r.counts.accepted, r.counts.steps) == (0, 0, len(fresh))


def test_advisor_q5_uses_the_pilot_replay(tmp_path: Path) -> None:
    from prefixflow.pipeline.advisor.advise import advise

    write_dataset(tmp_path / "in", files=1, rows_per_file=6)
    job = {
        "task": "generate",
        "prompt_column": "text",
        "chat": "off",
        "sampling": {"max_tokens": 24},
        "engine": {"num_kv_blocks": 512},
    }
    advice = advise(load_job(str(tmp_path / "in"), "", "tiny", job), gpu="local", pilot_rows=4)
    q5 = next(a for a in advice.answers if a.number == 5)
    assert advice.workload.pilot is not None and advice.workload.pilot.ngram_replay[2] > 0
    assert any("replayed under n-gram prompt lookup" in e for e in q5.evidence)


def test_advisor_q5_counts_grammar_forced_drafts_from_the_pilot(tmp_path: Path) -> None:
    """An extract job: the pilot's replay drafts what the schema forces (keys, quotes), from the model's
    own output tokens, and Q5 reports how many of those forced drafts were accepted."""
    from prefixflow.pipeline.advisor.advise import advise

    write_dataset(tmp_path / "in", files=1, rows_per_file=6)
    schema = {
        "type": "object",
        "properties": {
            "sentiment": {"type": "string", "enum": ["positive", "negative"]},
            "score": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["sentiment", "score"],
        "additionalProperties": False,
    }
    job = {
        "task": "extract",
        "template": "Extract from: {{ text }}",
        "schema": schema,
        "chat": "off",
        "sampling": {"max_tokens": 40},
        "engine": {"num_kv_blocks": 512},
    }
    advice = advise(load_job(str(tmp_path / "in"), "", "tiny", job), gpu="local", pilot_rows=4)
    pilot = advice.workload.pilot
    assert pilot is not None
    forced_proposed, forced_accepted = pilot.forced_replay
    proposed, accepted, steps = pilot.ngram_replay
    assert 0 < forced_accepted <= forced_proposed <= proposed and forced_accepted <= accepted
    assert (accepted + steps) / steps > 1.3  # the forced keys alone make steps emit several tokens
    q5 = next(a for a in advice.answers if a.number == 5)
    assert any("forced by the output grammar" in e for e in q5.evidence), q5.evidence

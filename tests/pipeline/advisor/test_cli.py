"""`prefixflow plan --advise`: human and JSON output, torch-free without --pilot, clear errors for bad flags."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prefixflow.pipeline.cli import main
from tests.pipeline.advisor.support import unique_texts, write_rows

REPO = Path(__file__).resolve().parents[3]
NO_TORCH = "import sys; sys.modules['torch'] = None; from prefixflow.pipeline.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture
def job_input(tmp_path) -> tuple[str, str]:
    folder = write_rows(tmp_path / "in", [{"id": f"r{i}", "text": t} for i, t in enumerate(unique_texts(24))])
    job = tmp_path / "job.yaml"
    job.write_text(
        "task: summarize\nid_column: id\nsystem_prompt: You summarize.\nsampling: {max_tokens: 8}\n"
        "engine: {max_model_len: 512}\n"
    )
    return folder, str(job)


def _no_torch(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", NO_TORCH, *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def test_advise_runs_with_torch_unimportable_and_pilot_says_it_needs_it(job_input, tmp_path) -> None:
    folder, job = job_input
    done = _no_torch(
        "plan",
        "--input",
        folder,
        "--job",
        job,
        "--model",
        "tiny",
        "--advise",
        "--gpu",
        "h100",
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    advice = json.loads(done.stdout)["advise"]
    assert [a["number"] for a in advice["answers"]] == [1, 2, 3, 4, 5, 6]
    assert advice["device"]["name"] == "h100" and advice["tokens"]["sampled_rows"] == 24
    assert advice["engine"]["max_model_len"] == 512  # the configured limit, inside what fits
    assert advice["memory"]["largest"]["max_model_len"] == 512
    assert (
        advice["memory"]["largest"]["max_num_seqs"] == advice["memory"]["precisions"]["bf16"]["seqs_at_p99"]
    )
    pilot = _no_torch(
        "plan", "--input", folder, "--job", job, "--model", "tiny", "--advise", "--pilot", "2", cwd=tmp_path
    )
    assert pilot.returncode == 2
    assert "--pilot runs the engine, which needs torch" in pilot.stderr


def test_human_report_walks_the_six_questions(job_input, capsys) -> None:
    folder, job = job_input
    assert (
        main(["plan", "--input", folder, "--job", job, "--model", "tiny", "--advise", "--gpu", "a100-80g"])
        == 0
    )
    out = capsys.readouterr().out  # a report: stdout (`plan --advise > advice.txt`)
    for heading in (
        "Tokens",
        "Sharing",
        "Memory on a100-80g",
        "The six questions",
        "Recommended engine settings",
        "Time and cost",
    ):
        assert heading in out
    assert "6. Do prefill and decode contend at scale?" in out
    assert "largest that fit (bf16): max_model_len" in out


def test_pilot_measures_output_lengths(job_input, capsys) -> None:
    folder, job = job_input
    assert (
        main(
            ["plan", "--input", folder, "--job", job, "--model", "tiny", "--advise", "--pilot", "4", "--json"]
        )
        == 0
    )
    tokens = json.loads(capsys.readouterr().out)["advise"]["tokens"]
    assert tokens["output_source"] == "pilot"
    pilot = tokens["pilot"]
    assert pilot["rows"] == 4 and pilot["generated_tokens"] > 0 and pilot["elapsed_s"] > 0
    assert 1 <= pilot["output_tokens"]["max"] <= 8  # max_tokens 8


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--advise", "--gpu", "v100"],
            "--gpu: unknown GPU type 'v100'; choose one of h200, h100, a100-80g, l4",
        ),
        (["--pilot", "3"], "--gpu, --sample-rows and --pilot apply to `plan --advise`; add --advise"),
        (["--advise", "--model", "no-such-model"], "model 'no-such-model' is not a directory"),
    ],
)
def test_bad_advise_flags_fail_fast(job_input, capsys, flags, message) -> None:
    folder, job = job_input
    assert main(["plan", "--input", folder, "--job", job, *flags]) == 2
    assert message in capsys.readouterr().err.replace("\n", "")


def test_sample_rows_must_be_positive(job_input, capsys) -> None:
    folder, job = job_input
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--input", folder, "--job", job, "--advise", "--sample-rows", "0"])
    assert exc.value.code == 2 and "expected a positive number, got 0" in capsys.readouterr().err

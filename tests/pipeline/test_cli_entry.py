"""Output-state and model errors exit 2 before anything is written; the console script's dispatcher."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from prefixflow.pipeline.cli import main
from tests.pipeline.support import write_dataset

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, output: Path, model: str = "tiny") -> int:
    return main(
        [
            "run",
            "--input",
            str(tmp_path / "in"),
            "--output",
            str(output),
            "--model",
            model,
            "--prompt-column",
            "text",
            "--max-tokens",
            "2",
            "--no-progress",
        ]
    )


def test_bad_model_exits_2_naming_what_is_accepted_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    assert _run(tmp_path, tmp_path / "out", model="/nope/model") == 2
    err = capsys.readouterr().err
    assert "/nope/model" in err and "preset" in err and ".gguf" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_output_that_is_a_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    (tmp_path / "out.txt").write_text("not a folder")
    assert _run(tmp_path, tmp_path / "out.txt") == 2
    assert "is an existing file" in capsys.readouterr().err
    assert _run(tmp_path, tmp_path / "out.txt" / "sub") == 2
    assert "is a file" in capsys.readouterr().err
    assert (tmp_path / "out.txt").read_text() == "not a folder"


def test_unreadable_run_record_exits_2_and_even_new_run_deletes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    (tmp_path / "out" / "data").mkdir(parents=True)
    (tmp_path / "out" / "data" / "mine.parquet").write_text("kept")
    (tmp_path / "out" / "_prefixflow.json").write_text("{ truncated")
    assert _run(tmp_path, tmp_path / "out") == 2
    assert "not a readable prefixflow run record" in capsys.readouterr().err
    assert (
        main(
            [
                "run",
                "--input",
                str(tmp_path / "in"),
                "--output",
                str(tmp_path / "out"),
                "--model",
                "tiny",
                "--prompt-column",
                "text",
                "--no-progress",
                "--new-run",
            ]
        )
        == 2
    )
    assert "move it away or write to another --output" in capsys.readouterr().err
    assert (tmp_path / "out" / "data" / "mine.parquet").read_text() == "kept"
    assert main(["status", str(tmp_path / "out")]) == 2


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


BLOCK_PREFECT = (
    "import sys; sys.modules['prefect'] = None; from prefixflow.flows.cli import main; sys.exit(main())"
)


def test_console_script_works_without_prefect_and_lists_serve(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    res = _python(BLOCK_PREFECT, "plan", "--input", str(tmp_path / "in"), "--json")
    assert res.returncode == 0, res.stderr
    res = _python(BLOCK_PREFECT, "--help")
    assert res.returncode == 0 and "serve" in res.stdout and "run" in res.stdout
    res = _python(BLOCK_PREFECT, "serve", "--help")
    assert res.returncode == 2 and "needs prefect" in res.stderr


def test_pipeline_never_imports_flows() -> None:
    res = _python("import sys, prefixflow.pipeline.cli as cli; sys.exit(cli.main(['serve']))")
    assert res.returncode == 2 and "prefixflow serve" in res.stderr
    code = "import sys, prefixflow.pipeline.cli, prefixflow.pipeline; print(sorted(m for m in sys.modules if m.startswith('prefixflow.flows')))"
    assert _python(code).stdout.strip() == "[]"
    assert "prefixflow.flows.cli:main" in (REPO / "pyproject.toml").read_text()

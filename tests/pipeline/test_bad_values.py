"""Issue 22 items 8 and 9: bad engine values, malformed --storage-option values and an OpenAI Batch
output that is a folder are refused up front, in one line, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixflow.pipeline import JobConfigError, load_job
from prefixflow.pipeline.cli import main
from tests.pipeline.support import write_dataset


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("seed=abc", "engine.seed: 'abc' is not an integer"),
        ("block_size=abc", "engine.block_size: 'abc' is not an integer"),
        ("seed=99999999999999999999999", "engine.seed: 99999999999999999999999 is not an integer (64-bit)"),
        ("enforce_eager=maybe", "engine.enforce_eager: 'maybe' is not true or false"),
        ("dtype=3", "engine.dtype: 3 is not one of auto"),
        ("gpu_memory_utilization=lots", "is not a number"),
        ("max_model_len=1.5", "engine.max_model_len: 1.5 is not an integer"),
    ],
)
def test_bad_engine_values_are_refused_before_the_run_record(
    tmp_path: Path, capsys, setting: str, expected: str
) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    out = tmp_path / "out"
    code = main(
        [
            "run",
            "--input",
            str(tmp_path / "in"),
            "--output",
            str(out),
            "--model",
            "tiny",
            "--template",
            "Say: {{ text }}",
            "--no-progress",
            "--engine",
            setting,
        ]
    )
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and expected in err and "Traceback" not in err
    assert not out.exists()  # nothing written: the corrected command is not "a different job"


def test_good_engine_values_pass_and_ints_stay_numbers() -> None:
    spec = load_job(
        "in", "", "tiny", {"engine": {"seed": 3, "gpu_memory_utilization": 1, "max_model_len": None}}
    )
    assert spec.config.engine == {"seed": 3, "gpu_memory_utilization": 1, "max_model_len": None}
    with pytest.raises(JobConfigError, match="engine.seed: True is not an integer"):
        load_job("in", "", "tiny", {"engine": {"seed": True}})


def test_a_malformed_storage_option_is_one_usage_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(
            [
                "run",
                "--input",
                str(tmp_path),
                "--output",
                str(tmp_path / "o"),
                "--storage-option",
                "client_kwargs={a: [1",
            ]
        )
    err = capsys.readouterr().err
    assert (
        info.value.code == 2
        and "client_kwargs=" in err
        and "not valid YAML" in err
        and "Traceback" not in err
    )


def test_a_batch_output_that_is_a_folder_is_refused_up_front(tmp_path: Path, capsys) -> None:
    """Item 9: it was refused with a hint to pass --new-run, which then ran the whole batch and ended in
    IsADirectoryError with .tmp-* files left behind."""
    batch = tmp_path / "batch.jsonl"
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    }
    batch.write_text(json.dumps(line) + "\n")
    folder = tmp_path / "results.jsonl"
    folder.mkdir()
    for extra in ([], ["--new-run"]):
        code = main(
            [
                "run",
                "--input",
                str(batch),
                "--output",
                str(folder),
                "--model",
                "tiny",
                "--no-progress",
                *extra,
            ]
        )
        err = " ".join(capsys.readouterr().err.split())
        assert code == 2 and "is a folder" in err and "results.jsonl/results.jsonl" in err
    assert list(folder.iterdir()) == []
    assert not (tmp_path / "results.jsonl.prefixflow").exists()


def test_a_null_ids_derived_id_never_collides_with_a_real_id(tmp_path: Path, tiny_llm) -> None:
    """Item 13: a null id's derived id (`a.parquet#1`) could be a real id of another row: two output rows
    then had that id."""
    import polars as pl

    from prefixflow.pipeline.local_run import run_local
    from tests.pipeline.support import job, write_parquet

    write_parquet(tmp_path / "in" / "a.parquet", [{"id": "x", "text": "one"}, {"id": None, "text": "two"}])
    write_parquet(
        tmp_path / "in" / "b.parquet",
        [{"id": "a.parquet#1", "text": "three"}, {"id": "a.parquet#1#", "text": "four"}],
    )
    spec = load_job(
        str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("generate", sampling={"max_tokens": 2})
    )
    summary, _ = run_local(spec, llm=tiny_llm, progress=False)
    rows = pl.read_parquet(str(tmp_path / "out" / "data" / "**" / "*.parquet"))
    assert summary.complete and rows.height == 4 and rows["id"].n_unique() == 4
    null_row = rows.filter(pl.col("error_class") == "null_id")
    assert null_row["id"].to_list() == ["a.parquet#1##"] and null_row["row_index"].to_list() == [1]

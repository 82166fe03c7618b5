"""Issue 22 items 1, 2, 3, 10 and 12: the input changes between runs, a kill leaves a committed shard
unpublished, a committed part or a commit marker is deleted, and the manifest of a replaced run.

Whatever happens, what readers of OUTPUT/data/**/*.parquet see is each input row of the current input
at most once, exactly once once the run is complete, and `status` never says complete before that."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
import s3fs

from prefixflow.pipeline import (
    InputChanged,
    finalize,
    load_job,
    open_run,
    plan_shards,
    prepare_output,
    status,
)
from prefixflow.pipeline.cli import main
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import docs, job, write_dataset, write_parquet

CFG = job("generate", sampling={"max_tokens": 2}, output={"shard_rows": 3, "flush_rows": 2})


def _spec(tmp_path: Path, publish: str = "direct"):
    cfg = {**CFG, "output": {**CFG["output"], "publish": publish}}
    return load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)


def _ids(tmp_path: Path, errors: bool = False) -> list[str]:
    frame = pl.read_parquet(str(tmp_path / "out" / "data" / "**" / "*.parquet"))
    if not errors:
        frame = frame.filter(pl.col("error_class").is_null())
    return sorted(frame["id"].to_list())


def _input_ids(tmp_path: Path) -> list[str]:
    return sorted(pl.read_parquet(str(tmp_path / "in" / "*.parquet"))["id"].to_list())


def _delete_a_row(folder: Path) -> str:
    rows = pq.read_table(folder / "part-0.parquet").to_pylist()
    write_parquet(folder / "part-0.parquet", rows[:2] + rows[3:], row_group_size=3)
    return "part-0.parquet changed"


def _insert_at_top(folder: Path) -> str:
    rows = pq.read_table(folder / "part-1.parquet").to_pylist()
    write_parquet(folder / "part-1.parquet", docs(1, start=100) + rows, row_group_size=3)
    return "part-1.parquet changed"


def _remove_a_file(folder: Path) -> str:
    (folder / "part-1.parquet").unlink()
    return "part-1.parquet removed"


def _add_a_file_with_a_committed_id(folder: Path) -> str:
    write_parquet(folder / "part-2.parquet", docs(1, start=0) + docs(2, start=200), row_group_size=3)
    return "part-2.parquet added"


@pytest.mark.parametrize(
    "edit",
    [
        _delete_a_row,
        *(
            pytest.param(e, marks=pytest.mark.slow)
            for e in (_insert_at_top, _remove_a_file, _add_a_file_with_a_committed_id)
        ),
    ],
)
def test_a_changed_input_is_refused_by_name_and_new_run_starts_over(tmp_path: Path, tiny_llm, edit) -> None:
    write_dataset(tmp_path / "in", files=2, rows_per_file=6, row_group_size=3)
    summary, _ = run_local(_spec(tmp_path), llm=tiny_llm, progress=False)
    assert summary.complete
    named = edit(tmp_path / "in")
    with pytest.raises(InputChanged) as info:
        run_local(_spec(tmp_path), llm=tiny_llm, progress=False)
    assert named in str(info.value) and "--new-run" in str(info.value)  # the CLI prints it, exit 2
    assert _ids(tmp_path) == sorted(set(_ids(tmp_path)))  # the refused resume wrote nothing
    summary, failures = run_local(_spec(tmp_path), new_run=True, llm=tiny_llm, progress=False)
    assert failures == [] and summary.complete
    wanted = _input_ids(tmp_path)
    assert _ids(tmp_path, errors=True) == wanted  # every row of the new input once, nothing of the old
    good = _ids(tmp_path)
    assert len(good) == len(set(good))  # a repeated id is an error row, never a second result
    assert summary.shards_committed == summary.shards_total == len(plan_shards(_spec(tmp_path)))


def test_a_changed_s3_object_is_refused(tmp_path: Path, s3_endpoint: str, tiny_llm) -> None:
    bucket = f"b-{uuid.uuid4().hex[:8]}"
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir(bucket)
    write_dataset(tmp_path / "in", files=2, rows_per_file=3, row_group_size=3)
    fs.put(str(tmp_path / "in") + "/", f"{bucket}/docs/", recursive=True)
    spec = load_job(f"s3://{bucket}/docs", f"s3://{bucket}/out", "tiny", CFG, endpoint_url=s3_endpoint)
    assert run_local(spec, llm=tiny_llm, progress=False)[0].complete
    record = json.loads(fs.cat_file(f"{bucket}/out/_prefixflow.json"))
    assert record["inputs"]["part-0.parquet"]["etag"]
    rows = pq.read_table(tmp_path / "in" / "part-0.parquet").to_pylist()
    rows[0]["text"] = rows[0]["text"][::-1]  # same size, new content
    write_parquet(tmp_path / "edited.parquet", rows, row_group_size=3)
    fs.put(str(tmp_path / "edited.parquet"), f"{bucket}/docs/part-0.parquet")
    with pytest.raises(InputChanged, match="part-0.parquet changed"):
        run_local(spec, llm=tiny_llm, progress=False)


def _run_once(tmp_path: Path, tiny_llm, publish: str = "direct") -> tuple[Path, Path]:
    """A complete run of 2 files x 6 rows (4 shards); returns the run's data/ and _commits/ folders."""
    write_dataset(tmp_path / "in", files=2, rows_per_file=6, row_group_size=3)
    summary, _ = run_local(_spec(tmp_path, publish), llm=tiny_llm, progress=False)
    assert summary.complete and summary.rows == 12
    out = tmp_path / "out"
    return out / "data" / summary.run_id, out / "_commits" / summary.run_id


def test_status_is_not_complete_while_a_committed_shard_is_unpublished(tmp_path: Path, tiny_llm) -> None:
    """Item 2: the state a SIGKILL between the marker and its publish leaves (marker and staged parts,
    nothing in data/): status said complete with 12 rows while readers saw 9. (publish: copy; a direct part
    is in data/ before its marker, so it has no such state.)"""
    data, commits = _run_once(tmp_path, tiny_llm, publish="copy")
    marker = json.loads(sorted(commits.glob("*.json"))[0].read_text())
    out = tmp_path / "out"
    for part in marker["parts"]:
        (out / part["staged"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(out / part["data"], out / part["staged"])
    summary, _ = status(str(out))
    assert not summary.complete and summary.shards_unpublished == [marker["shard_id"]]
    assert summary.rows_published == 12 - marker["rows"] and summary.shards_lost == []
    prepare_output(_spec(tmp_path))  # any resume publishes it first thing
    assert _ids(tmp_path, errors=True) == _input_ids(tmp_path)
    assert status(str(out))[0].complete


def test_a_deleted_committed_part_is_regenerated_and_status_notices(tmp_path: Path, tiny_llm, capsys) -> None:
    """Item 3: every resume crashed with `RuntimeError: committed part ... is missing`."""
    data, commits = _run_once(tmp_path, tiny_llm)
    victim = sorted(data.rglob("*.parquet"))[0]
    victim.unlink()
    summary, _ = status(str(tmp_path / "out"))
    assert not summary.complete and summary.shards_lost == [victim.parent.name]
    assert main(["status", str(tmp_path / "out")]) == 0
    assert "generates them again" in " ".join(capsys.readouterr().err.split())
    summary, failures = run_local(_spec(tmp_path), llm=tiny_llm, progress=False)
    assert failures == [] and summary.complete and summary.rows == 12
    assert _ids(tmp_path, errors=True) == _input_ids(tmp_path)


def test_a_deleted_commit_marker_replaces_the_old_parts(tmp_path: Path, tiny_llm) -> None:
    """Item 12: the resume published the shard's new parts beside the old ones (rows twice), then refused
    to go on, calling its own parts files no prefixflow run wrote."""
    data, commits = _run_once(tmp_path, tiny_llm)
    marker = sorted(commits.glob("*.json"))[1]
    marker.unlink()
    summary, _ = status(str(tmp_path / "out"))
    assert not summary.complete and summary.foreign_files == [] and summary.orphan_parts
    summary, failures = run_local(_spec(tmp_path), llm=tiny_llm, progress=False)
    assert failures == [] and summary.complete and summary.rows == 12
    assert _ids(tmp_path, errors=True) == _input_ids(tmp_path)
    assert status(str(tmp_path / "out"))[0].complete


def test_markers_of_shards_outside_the_plan_never_count(tmp_path: Path, tiny_llm) -> None:
    data, commits = _run_once(tmp_path, tiny_llm)
    source = sorted(commits.glob("*.json"))[0]
    ghost = json.loads(source.read_text())
    ghost["shard_id"] = "ghost-00000000-0000000000-0000000003"
    for part in ghost["parts"]:
        part["data"] = part["data"].replace(source.stem, ghost["shard_id"])
        (tmp_path / "out" / part["data"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(data / source.stem / Path(part["data"]).name, tmp_path / "out" / part["data"])
    (commits / f"{ghost['shard_id']}.json").write_text(json.dumps(ghost))
    summary, _ = status(str(tmp_path / "out"))
    assert (
        summary.rows == 12
        and summary.shards_committed == 4
        and summary.shards_unplanned == [ghost["shard_id"]]
    )
    summary = finalize(open_run(_spec(tmp_path)))
    assert summary.rows == 12 and summary.complete
    assert _ids(tmp_path, errors=True) == _input_ids(tmp_path)  # its rows left data/


def test_the_manifest_says_in_progress_once_a_run_starts_writing(tmp_path: Path, tiny_llm) -> None:
    """Item 10: during a --new-run or a resume the manifest still said the replaced run was complete."""
    _run_once(tmp_path, tiny_llm)
    manifest = tmp_path / "out" / "_manifest.json"
    assert json.loads(manifest.read_text())["complete"] is True
    for new_run in (False, True):
        record = prepare_output(_spec(tmp_path), new_run=new_run)
        state = json.loads(manifest.read_text())
        assert (
            state["complete"] is False
            and state["run_id"] == record.run_id
            and state["state"] == "in progress"
        )

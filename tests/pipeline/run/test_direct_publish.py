"""``output.publish: direct`` (issue 23 item 1): every part a shard flushes goes straight to its next
data/ name (part-direct-N) before the marker. An earlier attempt's parts there (killed before its marker),
another attempt of the same shard, or a --new-run never let a row show twice in data/; a resume keeps
the earlier parts and copies nothing; finalize leaves no stray file and loses no done row.

Each test checks what a reader of OUTPUT/data/**/*.parquet sees at the states it can reach."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import prefixflow.pipeline.run.lease as lease
from prefixflow.pipeline import (
    finalize,
    load_job,
    open_run,
    plan_shards,
    prepare_output,
    prepare_run,
    run_shard,
    status,
)
from prefixflow.pipeline.local_run import run_local
from prefixflow.pipeline.run import commit as commits
from prefixflow.pipeline.tasks.output_schema import base_record, encode_part
from tests.pipeline.support import job, write_dataset

DIRECT = "part-direct-00000.parquet"


def _cfg(publish: str = "direct", flush_rows: int = 64) -> dict:
    return job("generate", output={"shard_rows": 10, "flush_rows": flush_rows, "publish": publish})


def _spec(tmp_path: Path, publish: str = "direct", flush_rows: int = 64):
    return load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", _cfg(publish, flush_rows))


def _visible(tmp_path: Path) -> pl.DataFrame:
    """Every row a reader of OUTPUT/data/**/*.parquet sees now."""
    files = sorted((tmp_path / "out" / "data").rglob("*.parquet"))
    return pl.concat([pl.read_parquet(f) for f in files]) if files else pl.DataFrame({"id": []})


def _names(tmp_path: Path, top: str = "data") -> list[str]:
    return sorted(p.name for p in (tmp_path / "out" / top).rglob("*") if p.is_file())


def _clean(tmp_path: Path, tiny_llm, flush_rows: int = 64) -> pl.DataFrame:
    ref = tmp_path / "ref"
    summary, _ = run_local(
        load_job(str(tmp_path / "in"), str(ref), "tiny", _cfg(flush_rows=flush_rows)),
        llm=tiny_llm,
        progress=False,
    )
    assert summary.complete
    return pl.read_parquet(summary.data_glob).sort("id").select("id", "output")


def _one_shard(tmp_path: Path) -> list[str]:
    return write_dataset(tmp_path / "in", files=1, rows_per_file=10, row_group_size=10)


def test_a_shard_written_as_one_part_lands_in_data_and_nothing_is_staged(tmp_path: Path, tiny_llm) -> None:
    ids = write_dataset(tmp_path / "in", files=2, rows_per_file=10, row_group_size=10)
    summary, failures = run_local(_spec(tmp_path), llm=tiny_llm, progress=False)
    assert not failures and summary.complete and summary.rows == 20
    assert _names(tmp_path) == [DIRECT, DIRECT] and _names(tmp_path, "_staging") == []
    assert sorted(_visible(tmp_path)["id"].to_list()) == sorted(ids)
    marker = open_run(_spec(tmp_path)).markers()[0]
    assert [p.staged == p.data and p.data.endswith(DIRECT) for p in marker.parts] == [True]
    assert status(str(tmp_path / "out"))[0].complete  # no orphan, nothing unpublished


def test_a_shard_of_several_parts_goes_straight_to_data_part_by_part(tmp_path: Path, tiny_llm) -> None:
    ids = _one_shard(tmp_path)
    spec = load_job(
        str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("generate", output={"flush_rows": 4})
    )
    summary, _ = run_local(spec, llm=tiny_llm, progress=False)
    assert summary.complete and _names(tmp_path) == [_direct(0), _direct(1), _direct(2)]
    assert _names(tmp_path, "_staging") == []
    (marker,) = open_run(spec).markers()
    assert [p.rows for p in marker.parts] == [4, 4, 2] and all(p.staged == p.data for p in marker.parts)
    assert sorted(_visible(tmp_path)["id"].to_list()) == sorted(ids)


def _direct(n: int) -> str:
    return f"part-direct-{n:05d}.parquet"


def _leftover(tmp_path: Path, rows: int = 10, n: int = 0) -> Path:
    """What an attempt killed before its marker leaves: its first ``rows`` rows of the shard in data/ as
    direct part ``n``, no marker (the part's bytes as a real attempt encodes them)."""
    spec = _spec(tmp_path)
    run = prepare_run(spec)
    (shard,) = plan_shards(spec)
    schema = run.record.schema
    records = [base_record(k, f"doc-{k:04d}", "part-0.parquet", {}) | {"output": "old"} for k in range(rows)]
    part = commits.write_direct(run.layout, shard.shard_id, encode_part(records, schema), n)
    assert part is not None and part.rows == rows
    assert commits.write_direct(run.layout, shard.shard_id, b"other", n) is None  # the name is taken now
    return Path(part.data)


def test_a_kill_before_the_marker_resumes_from_the_direct_part_and_generates_the_rest(
    tmp_path: Path, tiny_llm
) -> None:
    ids = _one_shard(tmp_path)
    clean = _clean(tmp_path, tiny_llm)
    left = _leftover(tmp_path, rows=6)
    assert sorted(_visible(tmp_path)["id"].to_list()) == sorted(ids)[:6]  # uncommitted, but each row once
    mid, _ = status(str(tmp_path / "out"))
    assert mid.orphan_parts == [str(left.relative_to(tmp_path / "out"))] and mid.foreign_files == []
    assert not mid.complete
    assert mid.shards_committed == 0 and mid.shards_pending == [plan_shards(_spec(tmp_path))[0].shard_id]
    summary, failures = run_local(_spec(tmp_path), llm=tiny_llm, progress=False)
    assert not failures and summary.complete and summary.rows == 10
    # the killed attempt's part is kept as it is; the resume wrote only the 4 missing rows, as part 1
    assert _names(tmp_path) == [_direct(0), _direct(1)] and left.exists()
    seen = _visible(tmp_path).sort("id").select("id", "output")
    assert seen["id"].to_list() == clean["id"].to_list()
    assert seen["output"].to_list() == ["old"] * 6 + clean["output"].to_list()[6:]
    assert _names(tmp_path, "_staging") == []
    after, _ = status(str(tmp_path / "out"))
    assert after.complete and after.orphan_parts == []


def test_finalize_moves_a_killed_attempts_direct_part_to_staging_unless_another_writer_is_live(
    tmp_path: Path, tiny_llm
) -> None:
    _one_shard(tmp_path)
    left = _leftover(tmp_path)
    spec = _spec(tmp_path)
    other = lease.OutputLease(open_run(spec).root)  # another process writing the output: perhaps committing
    other.write()
    try:
        summary = finalize(open_run(spec))
        assert left.exists() and not summary.complete  # it may be that shard's commit in progress
    finally:
        other.release()
    summary = finalize(open_run(spec))
    assert not left.exists() and summary.shards_committed == 0 and not summary.complete
    assert _names(tmp_path) == [] and status(str(tmp_path / "out"))[0].orphan_parts == []
    assert len(_names(tmp_path, "_staging")) == 1  # its rows are kept: the next attempt generates none
    summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    assert not failures and summary.complete and summary.output_tokens == 0
    assert _visible(tmp_path)["output"].to_list() == ["old"] * 10 and _names(tmp_path, "_staging") == []


def test_a_direct_name_taken_after_our_listing_mid_shard_never_shows_a_row_twice(
    tmp_path: Path, tiny_llm
) -> None:
    """Our Run listed part 0 (6 rows of a killed attempt); another attempt then created part 1 with the
    other 4 rows. Ours keeps part 0, generates the 4 rows, finds the name of part 1 taken, stages, and
    its commit asks the store, so its publish removes their part 1 before copying ours."""
    _one_shard(tmp_path)
    clean = _clean(tmp_path, tiny_llm)
    _leftover(tmp_path, rows=6)
    spec = _spec(tmp_path)
    ours = open_run(spec)
    (shard,) = plan_shards(spec)
    records = [
        base_record(k, f"doc-{k:04d}", "part-0.parquet", {}) | {"output": "theirs"} for k in range(6, 10)
    ]
    theirs = commits.write_direct(ours.layout, shard.shard_id, encode_part(records, ours.record.schema), 1)
    assert theirs is not None and theirs.data not in ours.present(shard.shard_id)
    assert _visible(tmp_path)["id"].n_unique() == 10
    run_shard(ours, shard, tiny_llm)
    names = _names(tmp_path)
    assert len(names) == 2 and _direct(0) in names and _direct(1) not in names
    seen = _visible(tmp_path).sort("id").select("id", "output")
    assert seen["output"].to_list() == ["old"] * 6 + clean["output"].to_list()[6:]


@pytest.mark.parametrize("flush_rows", [64, 4])
def test_a_second_attempt_of_the_same_shard_finds_the_name_taken_and_adopts_the_winner(
    tmp_path: Path, tiny_llm, flush_rows: int
) -> None:
    """Two Runs opened before either committed (two processes on one shard): the first creates its direct
    part(s) and its marker; the second's first direct create fails, it stages every part, loses the marker
    and takes the winner's. data/ holds the winner's parts alone throughout; finalize removes the loser's
    staged parts."""
    _one_shard(tmp_path)
    clean = _clean(tmp_path, tiny_llm, flush_rows)
    spec = _spec(tmp_path, flush_rows=flush_rows)
    first = prepare_run(spec)
    second = open_run(spec)
    (shard,) = plan_shards(spec)
    won = run_shard(first, shard, tiny_llm)
    direct = [_direct(n) for n in range(-(-10 // flush_rows))]
    assert _names(tmp_path) == direct and not won.skipped
    late = run_shard(second, shard, tiny_llm)
    assert not late.skipped and second.marker(shard.shard_id) == first.marker(shard.shard_id)
    assert _names(tmp_path) == direct and len(_names(tmp_path, "_staging")) == len(direct)  # the loser's
    assert _visible(tmp_path).sort("id").select("id", "output").equals(clean)
    summary = finalize(open_run(spec))
    assert summary.complete and _names(tmp_path, "_staging") == [] and _names(tmp_path) == direct


def test_a_direct_part_written_after_our_listing_is_removed_before_our_copy_is_published(
    tmp_path: Path, tiny_llm
) -> None:
    """Another attempt created the direct part after this Run listed the output and has not created its
    marker yet. This attempt finds the name taken, stages, wins the marker and must remove that file
    (its listing does not show it) before copying, or data/ would show the shard twice. The other attempt
    then loses the marker race and takes ours."""
    _one_shard(tmp_path)
    clean = _clean(tmp_path, tiny_llm)
    spec = _spec(tmp_path)
    ours = prepare_run(spec)
    (shard,) = plan_shards(spec)
    theirs = commits.write_direct(ours.layout, shard.shard_id, _reference_part(tmp_path))
    assert theirs is not None and theirs.data not in ours.present(shard.shard_id)
    run_shard(ours, shard, tiny_llm)
    names = _names(tmp_path)
    assert len(names) == 1 and names != [DIRECT]
    assert _visible(tmp_path).sort("id").select("id", "output").equals(clean)
    late = commits.build_marker(ours.layout, shard.shard_id, ours.fingerprint, "theirs", [theirs], 0.1, 10)
    assert commits.commit(ours.layout, late) == ours.marker(shard.shard_id)
    assert _names(tmp_path) == names


def _reference_part(tmp_path: Path) -> bytes:
    """The shard's one part as another attempt writes it: the reference run's."""
    (part,) = (tmp_path / "ref" / "data").rglob("*.parquet")
    return part.read_bytes()


def test_a_stale_direct_attempt_removes_its_part_when_a_copied_commit_won(tmp_path: Path, tiny_llm) -> None:
    """The winner committed through the copy path (publish: copy; not in the fingerprint, so a resume may
    switch); a stale Run that never saw that commit creates the free direct name, loses the marker and
    removes its own part again, so data/ ends with the winner's rows once."""
    _one_shard(tmp_path)
    clean = _clean(tmp_path, tiny_llm)
    stale = prepare_run(_spec(tmp_path))
    winner = open_run(_spec(tmp_path, "copy"))
    (shard,) = plan_shards(_spec(tmp_path))
    run_shard(winner, shard, tiny_llm)
    copied = _names(tmp_path)
    assert len(copied) == 1 and copied != [DIRECT]
    late = run_shard(stale, shard, tiny_llm)
    assert late.rows == 10 and stale.marker(shard.shard_id) == winner.marker(shard.shard_id)
    assert _names(tmp_path) == copied
    assert _visible(tmp_path).sort("id").select("id", "output").equals(clean)


@pytest.mark.parametrize("publish", ["direct", "copy"])
def test_switching_publish_on_resume_keeps_the_committed_shards(
    tmp_path: Path, tiny_llm, publish: str
) -> None:
    write_dataset(tmp_path / "in", files=2, rows_per_file=10, row_group_size=10)
    spec = _spec(tmp_path, publish)
    run = prepare_run(spec)
    first, second = plan_shards(spec)
    run_shard(run, first, tiny_llm)
    other = "copy" if publish == "direct" else "direct"
    summary, failures = run_local(_spec(tmp_path, other), llm=tiny_llm, progress=False)
    assert not failures and summary.complete and summary.rows == 20
    assert sorted(n == DIRECT for n in _names(tmp_path)) == [False, True]
    assert _visible(tmp_path)["id"].n_unique() == 20 and _visible(tmp_path).height == 20
    assert prepare_output(spec).run_id == summary.run_id  # the same run: publish is outside the fingerprint


def test_publish_takes_direct_or_copy_only(tmp_path: Path) -> None:
    from prefixflow.pipeline import JobConfigError

    _one_shard(tmp_path)
    with pytest.raises(
        JobConfigError, match="output.publish: 'move' is not allowed; allowed values: direct, copy"
    ):
        load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job(output={"publish": "move"}))
    assert _spec(tmp_path, "copy").fingerprint_hash() == _spec(tmp_path).fingerprint_hash()

"""The persistent KV tier (``kv_cache_dir``): a second engine on the same directory reloads the first
one's prompt blocks instead of computing them, with the same tokens as transformers and as the tier
off; another model, dtype or block size never reads them; a corrupt file is detected, removed and
recomputed; the size cap holds; and the cost model, not the tier, decides whether a read pays."""

from __future__ import annotations

import threading

import pytest

from prefixflow.engine import LLM, SamplingParams
from prefixflow.engine.kv_offload import cost_model, disk_files
from tests.engine.hf_models import hf_greedy, make_model_dir, random_prompts
from tests.engine.tp_support import assert_processes_gone

# 48 blocks of 4 tokens: the prompts (a shared 40-token head and short tails) fit, so the first run
# computes everything once and writes its full prompt blocks; the second finds them on disk only.
OPTIONS = dict(dtype="float32", device="cpu", num_kv_blocks=48, block_size=4, max_num_batched_tokens=32)
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


@pytest.fixture
def reads_pay(monkeypatch):
    """The tiny models compute a block faster than any disk reads one, so the engine's cost model
    (rightly) recomputes; these tests give the disk a rate at which reading wins."""
    monkeypatch.setattr(cost_model, "DISK_RATE", (1e15, 0.0))


@pytest.fixture(scope="module")
def rows():
    head = random_prompts(1, 40, 40, seed=3)[0]
    return [head + tail for tail in random_prompts(5, 3, 9, seed=4)]


def run(llm: LLM, rows: list[list[int]]) -> list[list[int]]:
    try:
        return [list(o.token_ids) for o in llm.generate(rows, GREEDY)]
    finally:
        llm.close()


def full_prompt_blocks(rows: list[list[int]], bs: int = 4) -> int:
    """Distinct full prompt blocks (each prefix once)."""
    return len({tuple(r[: (i + 1) * bs]) for r in rows for i in range(len(r) // bs)})


def test_second_engine_on_the_same_dir_reloads_instead_of_computing(llama_dir, rows, tmp_path, reads_pay):
    want = run(LLM(str(llama_dir), **OPTIONS), rows)
    assert want == hf_greedy(llama_dir, rows, GREEDY.max_tokens)
    first = LLM(str(llama_dir), kv_cache_dir=str(tmp_path), **OPTIONS)
    assert run(first, rows) == want
    s1 = first.stats()
    assert s1.kv_disk_written_tokens == 4 * full_prompt_blocks(rows)  # every full prompt block, once
    assert s1.kv_disk_hits == 0
    assert len(list(tmp_path.rglob("*.kv"))) == full_prompt_blocks(rows)
    second = LLM(str(llama_dir), kv_cache_dir=str(tmp_path), **OPTIONS)
    assert run(second, rows) == want
    s2 = second.stats()
    assert s2.kv_disk_hits > 0 and s2.kv_disk_loaded_tokens == 4 * s2.kv_disk_hits
    assert s2.kv_disk_read_bytes > 0 and s2.kv_disk_failed_blocks == 0
    assert s2.kv_reloaded_tokens >= s2.kv_disk_loaded_tokens  # disk -> host -> device
    assert s2.computed_prompt_tokens <= s1.computed_prompt_tokens - s2.kv_disk_loaded_tokens
    assert s2.kv_disk_written_tokens == 0  # nothing new to write
    # without kv_offload_bytes the host tier is the staging area: as large as the device pool
    assert (
        second.engine.kv.host is not None
        and second.engine.kv.host.pool.num_blocks == OPTIONS["num_kv_blocks"]
    )


def test_another_model_dtype_or_block_size_never_reads_the_files(
    llama_dir, rows, tmp_path, tmp_path_factory, reads_pay
):
    run(LLM(str(llama_dir), kv_cache_dir=str(tmp_path), **OPTIONS), rows)
    written = {p.name for p in tmp_path.rglob("*.kv")}
    # same architecture and shapes (same payload size), other weights: the dangerous case
    twin = make_model_dir(tmp_path_factory.mktemp("twin"), "llama-gqa-llama3rope", seed=1)
    others = [
        (twin, OPTIONS),
        (llama_dir, dict(OPTIONS, dtype="bfloat16")),
        (llama_dir, dict(OPTIONS, block_size=8, num_kv_blocks=24)),
    ]
    for model, opts in others:
        llm = LLM(str(model), kv_cache_dir=str(tmp_path), **opts)
        got = run(llm, rows)
        s = llm.stats()
        assert s.kv_disk_lookups > 0 and s.kv_disk_hits == 0 and s.kv_disk_failed_blocks == 0
        assert s.kv_disk_written_tokens > 0  # into its own namespace
        if model is twin:
            assert got == hf_greedy(twin, rows, GREEDY.max_tokens)
    namespaces = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(namespaces) == 4 and all((p / "namespace.json").is_file() for p in namespaces)
    assert written <= {p.name for p in tmp_path.rglob("*.kv")}


def test_a_corrupt_block_file_is_detected_removed_and_recomputed(llama_dir, rows, tmp_path, reads_pay):
    want = run(LLM(str(llama_dir), kv_cache_dir=str(tmp_path), **OPTIONS), rows)
    files = sorted(tmp_path.rglob("*.kv"))
    for path in files:  # flip one payload byte in every file: sizes and headers stay valid
        data = bytearray(path.read_bytes())
        data[disk_files.HEADER.size + 5] ^= 0x40
        path.write_bytes(bytes(data))
    llm = LLM(str(llama_dir), kv_cache_dir=str(tmp_path), **OPTIONS)
    with pytest.warns(RuntimeWarning, match="checksum mismatch"):
        assert run(llm, rows) == want
    s = llm.stats()
    assert s.kv_disk_corrupt_files > 0 and s.kv_disk_failed_blocks >= s.kv_disk_corrupt_files
    assert s.kv_disk_hits == 0  # the first block of the shared head was corrupt: nothing after it is read
    assert s.kv_disk_written_tokens > 0  # recomputed blocks are written anew
    # a corrupt file is found when it is read; the blocks recomputed above are whole again
    third = LLM(str(llama_dir), kv_cache_dir=str(tmp_path), **OPTIONS)
    assert run(third, rows) == want
    assert third.stats().kv_disk_hits > s.kv_disk_hits


def test_the_size_cap_holds_and_evicts_least_recently_used(llama_dir, rows, tmp_path, reads_pay):
    off = LLM(str(llama_dir), **OPTIONS)
    cap = 6 * (
        disk_files.HEADER.size + off.engine.runner.shard.block_bytes + disk_files.CRC.size
    )  # 6 block files
    want = run(off, rows)
    llm = LLM(str(llama_dir), kv_cache_dir=str(tmp_path), kv_cache_dir_bytes=cap, **OPTIONS)
    assert run(llm, rows) == want
    assert llm.stats().kv_disk_written_tokens > 4 * 6
    assert 0 < disk_files.directory_bytes(tmp_path) <= cap


def test_the_cost_model_recomputes_when_reading_does_not_pay(llama_dir, rows, tmp_path):
    # the engine's default disk rates: a tiny model's 4-token block computes faster than a file opens
    want = run(LLM(str(llama_dir), kv_cache_dir=str(tmp_path), **OPTIONS), rows)
    llm = LLM(str(llama_dir), kv_cache_dir=str(tmp_path), **OPTIONS)
    assert run(llm, rows) == want
    s = llm.stats()
    assert s.kv_disk_hits == 0 and s.kv_disk_declined_tokens > 0


def test_two_engines_writing_and_reading_one_dir_at_once_are_both_correct(
    llama_dir, rows, tmp_path, reads_pay
):
    want = run(LLM(str(llama_dir), **OPTIONS), rows)
    got: dict[int, list[list[int]]] = {}
    engines = [LLM(str(llama_dir), kv_cache_dir=str(tmp_path), **OPTIONS) for _ in range(2)]

    def work(i: int) -> None:
        got[i] = [list(o.token_ids) for o in engines[i].generate(rows * 2, GREEDY)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for llm in engines:
        llm.close()
    assert got == {0: want * 2, 1: want * 2}
    assert not list(tmp_path.rglob("*.tmp"))
    after = LLM(str(llama_dir), kv_cache_dir=str(tmp_path), **OPTIONS)
    assert run(after, rows) == want and after.stats().kv_disk_failed_blocks == 0


@pytest.mark.slow
@pytest.mark.parametrize("split", [dict(tensor_parallel_size=2), dict(pipeline_parallel_size=2)])
def test_every_rank_writes_and_reads_its_own_part(llama_dir, rows, tmp_path, reads_pay, split):
    # TP: each rank its KV heads; PP: each stage its layers. A split never reads another split's files.
    want = run(LLM(str(llama_dir), **OPTIONS), rows)
    run(LLM(str(llama_dir), kv_cache_dir=str(tmp_path), **OPTIONS), rows)  # one rank's namespace
    for turn in range(2):
        llm = LLM(str(llama_dir), kv_cache_dir=str(tmp_path), **split, **OPTIONS)
        pids = llm.engine.runner.pool.pids
        assert run(llm, rows) == want
        s = llm.stats()
        assert (s.kv_disk_hits > 0) == (turn == 1) and s.kv_disk_failed_blocks == 0
        assert_processes_gone(pids)
    names = [p.name for p in tmp_path.rglob("*.kv")]
    assert sum(n.endswith(".1.kv") for n in names) == full_prompt_blocks(rows)  # rank 1's part of each block


def test_a_directory_that_cannot_be_created_is_a_clear_error(llama_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="kv_cache_dir=.*cannot be used.*writable local directory"):
        LLM(str(llama_dir), kv_cache_dir=str(blocker / "kv"), **OPTIONS)


@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_bad_cap_is_refused(value):
    with pytest.raises(ValueError, match="kv_cache_dir_bytes"):
        LLM("tiny", kv_cache_dir="/tmp/x", kv_cache_dir_bytes=value)

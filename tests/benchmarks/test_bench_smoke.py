"""Each benchmark's main at its smallest settings on the tiny preset (CPU); fields present and sane.

No timing assertions: only counts, ratios the engine controls, and structure.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import engine_vs_hf, prefix_bench, report, throughput
from benchmarks import prefix_workloads as pw
from benchmarks.common import percentiles

CPU = ["--device", "cpu", "--threads", "1"]
POOL = ["--num-kv-blocks", "512"]  # small pools allocate fast


def test_trie_distinct_tokens_hand_counted() -> None:
    # trie nodes: 1, 1-2, 1-2-3, 1-2-4, 1-5, 6 (the repeated prompt adds nothing)
    prompts = [[1, 2, 3], [6], [1, 2, 4], [1, 5], [1, 2, 3]]
    assert pw.distinct_prefix_tokens(prompts) == 6
    assert pw.distinct_prefix_tokens([]) == 0
    assert pw.distinct_prefix_tokens([[7, 7, 7, 7]]) == 4


def test_block_cache_minimum_hand_counted() -> None:
    # block size 2: the second prompt reuses blocks [1,2] and [3,4] and computes only its last token
    assert pw.block_cache_min_tokens([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6]], 2) == 5 + 1
    # identical prompts: the last token is never served from cache, so its whole block is recomputed
    assert pw.block_cache_min_tokens([[1, 2, 3, 4], [1, 2, 3, 4]], 2) == 4 + 2
    # a shared part shorter than a block shares nothing
    assert pw.block_cache_min_tokens([[1, 2, 3], [1, 2, 4]], 4) == 6


def test_percentiles_nearest_rank() -> None:
    assert percentiles(list(range(1, 101))) == {"p50": 50, "p90": 90, "p99": 99}
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}


def test_labeling_and_chat_shapes() -> None:
    lab = pw.labeling(512, num_prefixes=3, num_docs=5, prefix_len=40, doc_len=10, scale=0.5, seed=1)
    assert len(lab.prompts) == 15 and len(lab.max_tokens) == 15
    heads = {tuple(p[:16]) for p in lab.prompts}
    assert len(heads) == 3  # every row starts with one of the 3 prefixes (>= 16 tokens each)
    assert [tuple(p[:16]) for p in lab.prompts] != sorted(tuple(p[:16]) for p in lab.prompts)  # shuffled
    assert pw.distinct_prefix_tokens(lab.prompts) < lab.prompt_tokens

    chat = pw.chat(512, num_conversations=2, turns=3, system_len=20, user_len=5, assistant_len=5, seed=2)
    assert len(chat.prompts) == 6
    system = chat.prompts[0][:20]
    assert all(p[:20] == system for p in chat.prompts)
    longest = sorted(chat.prompts, key=len)[-2:]
    # every shorter turn of a conversation is a prefix of that conversation's last turn
    nested = sum(any(q[: len(p)] == p for q in longest if q is not p) for p in chat.prompts)
    assert nested >= 4


def test_engine_vs_hf_smoke(tmp_path) -> None:
    out = tmp_path / "evh.json"
    args = ["--num-prompts", "4", "--min-prompt-len", "4", "--max-prompt-len", "12", "--max-new-tokens", "4"]
    result = engine_vs_hf.main([*CPU, *POOL, *args, "--batch-size", "2", "--json", str(out)])
    assert json.loads(out.read_text())["benchmark"] == "engine_vs_hf"
    names = [r["engine"] for r in result["engines"]]
    assert names == ["prefixflow", "hf_generate"]
    for row in result["engines"]:
        assert row["output_tokens"] == 16 and row["requests"] == 4
        assert row["output_tok_s"] > 0 and row["ttft_p50_s"] is not None
    assert result["ratio_output_tok_s"] > 0
    assert result["greedy_agreement"] == 1.0  # same weights, float32, greedy
    assert result["environment"]["torch"]
    assert "| prefixflow | 4 | 16 |" in report.render(result)


def test_prefix_bench_smoke(tmp_path) -> None:
    out = tmp_path / "pb.json"
    args = [
        "--workloads",
        "labeling,chat",
        "--num-prefixes",
        "2",
        "--num-docs",
        "8",
        "--prefix-len",
        "400",
        "--doc-len",
        "40",
        "--output-len",
        "2",
        "--conversations",
        "2",
        "--turns",
        "2",
        "--scale",
        "1",
        "--chat-output-len",
        "2",
        "--block-size",
        "4",
    ]
    result = prefix_bench.main([*CPU, *POOL, *args, "--json", str(out)])
    assert json.loads(out.read_text())["benchmark"] == "prefix_bench"
    labeling, chat = result["workloads"]
    assert labeling["workload"]["requests"] == 16 and chat["workload"]["requests"] == 4
    for w in (labeling, chat):
        d = w["workload"]
        runs = {r["config"]: r for r in w["runs"]}
        assert len(runs) == 5
        for r in runs.values():
            # token-granular sharing (issue 28) computes below the block-cache minimum, never below the trie
            assert r["computed_prompt_tokens"] >= d["distinct_prefix_tokens"]
            assert d["block_cache_min_tokens"] >= d["distinct_prefix_tokens"]
            assert r["output_tokens"] == d["output_tokens"]
        assert runs["no-cache"]["computed_prompt_tokens"] == d["prompt_tokens"]
        assert runs["no-cache"]["prefix_hit_rate"] == 0
        assert runs["prefix+cache small-pool"]["kv_blocks"] == d["small_pool_blocks"]
    lab = {r["config"]: r for r in labeling["runs"]}
    assert lab["prefix+cache"]["computed/distinct"] <= 1.05  # the pool holds everything
    assert lab["no-cache"]["computed/distinct"] > 2
    assert report.render(result).count("| prefix+cache small-pool |") == 2


def test_throughput_smoke(tmp_path) -> None:
    out = tmp_path / "tp.json"
    args = [
        "--num-prompts",
        "4",
        "--min-len",
        "4",
        "--max-len",
        "8",
        "--peer-prompts",
        "2",
        "--hf-batch-size",
        "2",
    ]
    result = throughput.main([*CPU, *POOL, *args, "--json", str(out)])
    assert json.loads(out.read_text())["benchmark"] == "throughput"
    rows = result["rows"]
    assert [(r["subset"], r["engine"]) for r in rows][:2] == [("all", "prefixflow"), ("peer", "prefixflow")]
    assert rows[0]["requests"] == 4 and rows[1]["requests"] == 2
    assert rows[0]["output_tokens"] == result["workload"]["output_tokens"]
    peers = {r["engine"] for r in rows[2:]}
    assert peers | set(result["skipped"]) == {"hf_generate", "hf_continuous"}
    for name in peers:
        assert result["ratio_to_peer"][name] > 0
        assert result["greedy_agreement"][name] == 1.0
    for row in rows:
        assert row["output_tok_s"] > 0 and row["total_tok_s"] > row["output_tok_s"]
        assert row["itl_p50_s"] is None or row["itl_p50_s"] <= row["itl_p99_s"]
        if "roofline" in result and "bytes_per_s" in result["roofline"]:
            assert 0 < row["roofline_frac"]
    assert "| all | prefixflow | 4 |" in report.render(result)


@pytest.mark.parametrize("bad", [["--workloads", "nope"]])
def test_prefix_bench_rejects_unknown_workload(bad: list[str]) -> None:
    with pytest.raises(SystemExit):
        prefix_bench.main([*CPU, *bad])


@pytest.mark.slow
def test_tp_bench_runs_tiny(tmp_path) -> None:
    from benchmarks import tp_bench

    out = tmp_path / "tp.json"
    argv = ["--preset", "tiny", "--threads", "2", "--repeats", "1", "--num-prompts", "2", "--max-tokens", "3"]
    assert tp_bench.main([*argv, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["greedy_identical"] is True
    one, two = data["rows"]
    assert (one["tp"], two["tp"]) == (1, 2) and one["output_tokens"] == two["output_tokens"] == 6
    assert two["all_reduces_per_step"] == 5  # tiny: 2 layers x (o_proj, down_proj) + the embedding

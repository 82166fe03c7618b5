"""Q4's host KV tier recommendation: none while the pool holds the working set, the excess plus
headroom in whole GiB otherwise, never more than half the host's memory."""

from __future__ import annotations

from prefixflow.pipeline.advisor.advise import advise
from prefixflow.pipeline.advisor.host_tier import GIB, host_memory_bytes, recommend_offload_bytes
from prefixflow.pipeline.job.spec import load_job
from tests.pipeline.advisor.support import instruction, unique_texts, write_rows

KV_8B = 131072  # Llama-3.1-8B bf16 KV bytes per token


def test_no_host_tier_while_the_pool_holds_the_working_set():
    assert recommend_offload_bytes(1000, 2000, KV_8B, 64 * GIB) == 0
    assert recommend_offload_bytes(2000, 2000, KV_8B, 64 * GIB) == 0


def test_the_excess_plus_a_quarter_in_whole_gib():
    # 100,000 tokens over the pool x 128 KiB = 12.2 GiB, x 1.25 = 15.3 GiB -> 16 GiB
    assert recommend_offload_bytes(1_100_000, 1_000_000, KV_8B, 512 * GIB) == 16 * GIB


def test_capped_at_half_the_host_memory():
    assert recommend_offload_bytes(10_000_000, 1_000_000, KV_8B, 100 * GIB) == 50 * GIB


def test_q4_reports_the_working_set_and_sets_kv_offload_bytes(tmp_path):
    texts = unique_texts(20)
    folder = write_rows(tmp_path / "in", [{"id": f"r{i}", "text": t} for i, t in enumerate(texts)])
    job = {
        "task": "generate",
        "id_column": "id",
        "chat": "off",
        "template": instruction(200) + "\n\n{{ text }}",
        "sampling": {"max_tokens": 8},
    }
    advice = advise(load_job(folder, "", "tiny", job), gpu="h200")
    q4 = next(a for a in advice.answers if a.number == 4)
    assert any("working set about" in line for line in q4.evidence)
    assert advice.settings["kv_offload_bytes"] == 0  # a tiny model's pool on an H200 holds everything
    assert "kv_offload_bytes=0" in q4.recommendation
    assert host_memory_bytes() > 0

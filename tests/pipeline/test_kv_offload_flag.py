"""--kv-offload-gb / the flow's kv_offload_gb: GiB on the command line, engine.kv_offload_bytes in the job;
--kv-cache-dir / --kv-cache-dir-gb the same for the disk tier."""

from __future__ import annotations

import pytest

from prefixflow.pipeline.cli import build_parser
from prefixflow.pipeline.job.flags import overrides_from_args
from prefixflow.pipeline.job.spec import fingerprinted_engine_fields, load_job
from tests.pipeline.advisor.support import write_rows

JOB = {"task": "generate", "prompt_column": "prompt", "chat": "off", "sampling": {"max_tokens": 4}}


@pytest.fixture()
def folder(tmp_path):
    return write_rows(tmp_path / "in", [{"prompt": "hello"}])


def test_the_flag_becomes_engine_kv_offload_bytes(folder) -> None:
    args = build_parser().parse_args(["run", "--input", folder, "--output", "out", "--kv-offload-gb", "0.5"])
    overrides = overrides_from_args(args)
    assert overrides == {"kv_offload_gb": 0.5}
    spec = load_job(folder, "", "tiny", JOB, **overrides)
    assert spec.config.engine["kv_offload_bytes"] == 2**29


def test_the_host_tier_does_not_change_the_job_fingerprint() -> None:
    assert "kv_offload_bytes" not in fingerprinted_engine_fields()


def test_a_negative_size_is_refused_before_any_work(folder) -> None:
    with pytest.raises(Exception, match="kv_offload_bytes"):
        load_job(folder, "", "tiny", JOB, kv_offload_gb=-1)


def test_the_disk_tier_flags_become_engine_kv_cache_dir_and_its_cap(folder, tmp_path) -> None:
    argv = [
        "run",
        "--input",
        folder,
        "--output",
        "out",
        "--kv-cache-dir",
        str(tmp_path / "kv"),
        "--kv-cache-dir-gb",
        "2",
    ]
    overrides = overrides_from_args(build_parser().parse_args(argv))
    assert overrides == {"kv_cache_dir": str(tmp_path / "kv"), "kv_cache_dir_gb": 2.0}
    spec = load_job(folder, "", "tiny", JOB, **overrides)
    assert spec.config.engine["kv_cache_dir"] == str(tmp_path / "kv")
    assert spec.config.engine["kv_cache_dir_bytes"] == 2 * 2**30


def test_the_disk_tier_does_not_change_the_job_fingerprint() -> None:
    # a resumed run may switch it on, move it or resize it: a block file holds the KV the prompt computes
    assert not {"kv_cache_dir", "kv_cache_dir_bytes"} & set(fingerprinted_engine_fields())

"""--kv-offload-gb / the flow's kv_offload_gb: GiB on the command line, engine.kv_offload_bytes in the job."""

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

"""Which engine settings enter the job fingerprint: every EngineConfig field but an explicit list of
those that cannot change outputs. A field the engine adds later must be classified here."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from prefixflow.engine import EngineConfig
from prefixflow.pipeline import load_job
from prefixflow.pipeline.job.spec import ENGINE_FIELDS_WITHOUT_OUTPUT_EFFECT, fingerprinted_engine_fields
from tests.pipeline.support import job, write_dataset

# The fields known to change outputs. Together with ENGINE_FIELDS_WITHOUT_OUTPUT_EFFECT this must
# cover EngineConfig: a new field fails test_every_engine_field_is_classified until it is put in one.
CHANGE_OUTPUTS = {
    "dtype",
    "max_model_len",
    "seed",
    "block_size",
    "kernel_backend",
    "attention_backend",
    "quantization",
    "sparsity",
    "logprobs_mode",
    "batch_invariant",  # the last bits of scores and log-probs
    "cpu_int8",  # int8 matmuls on the CPU
}


def test_every_engine_field_is_classified() -> None:
    names = {f.name for f in fields(EngineConfig)}
    unclassified = names - CHANGE_OUTPUTS - set(ENGINE_FIELDS_WITHOUT_OUTPUT_EFFECT)
    assert not unclassified, (
        f"EngineConfig fields {sorted(unclassified)} are in neither list: add each to CHANGE_OUTPUTS here "
        "(it enters the fingerprint already) or, with the reason, to ENGINE_FIELDS_WITHOUT_OUTPUT_EFFECT"
    )
    assert not CHANGE_OUTPUTS & set(ENGINE_FIELDS_WITHOUT_OUTPUT_EFFECT)
    assert set(ENGINE_FIELDS_WITHOUT_OUTPUT_EFFECT) <= names, "a listed field no longer exists"
    assert set(fingerprinted_engine_fields()) == names - set(ENGINE_FIELDS_WITHOUT_OUTPUT_EFFECT)


def test_output_settings_change_the_fingerprint_and_others_do_not(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=1)

    def fp(**engine: object) -> str:
        spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("generate", engine=engine))
        return spec.fingerprint_hash()

    base = fp()
    assert fp(seed=7) != base and fp(max_model_len=128) != base and fp(block_size=32) != base
    assert (
        fp(max_num_seqs=3) == base and fp(kv_cache_memory_bytes=2**22) == base and fp(ordering="fifo") == base
    )
    assert fp(kernel_backend="torch") != base
    assert fp(cpu_int8="on") != base and fp(cpu_int8="on") != fp(cpu_int8="off")
    with pytest.warns(FutureWarning):  # the deprecated spelling is the same setting
        assert fp(attention_backend="torch") == fp(kernel_backend="torch")


def test_quantization_changes_the_fingerprint_and_the_model_identity(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=1)
    plain = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("generate"))
    int8 = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("generate"), quantization="int8")
    assert int8.config.engine["quantization"] == "int8"
    assert int8.fingerprint_hash() != plain.fingerprint_hash()
    assert int8.model_identity()["quantization"]["method"] == "int8"
    assert int8.model_identity()["digest"] != plain.model_identity()["digest"]
    assert int8.model_identity()["weight_bytes"] < plain.model_identity()["weight_bytes"]

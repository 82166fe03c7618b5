"""The job fingerprint names the model's weights and resolved dtype, not just the --model string."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixflow.pipeline import FingerprintMismatch, JobConfigError, load_job, prepare_output
from prefixflow.pipeline.job import spec as spec_module
from tests.pipeline.support import job, write_dataset


def _hf_dir(folder: Path, weights: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def test_replaced_weights_at_the_same_path_are_refused(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=1)
    model = _hf_dir(tmp_path / "model", b"first weights")
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), str(model), job("generate"))
    prepare_output(spec)
    (model / "model.safetensors").write_bytes(b"other weights, same path")
    again = load_job(str(tmp_path / "in"), str(tmp_path / "out"), str(model), job("generate"))
    with pytest.raises(FingerprintMismatch, match="model_identity.weights"):
        prepare_output(again)


def test_auto_dtype_resolving_differently_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_dataset(tmp_path / "in", files=1)
    cfg = job("generate", engine={"max_model_len": 160})  # no dtype: "auto"
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    spec_module._describe.cache_clear()
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    prepare_output(spec)  # a CPU run: auto -> float32
    record = json.loads((tmp_path / "out" / "_prefixflow.json").read_text())
    assert record["fingerprint"]["model_identity"]["dtype"] == "float32"
    spec_module._describe.cache_clear()
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # resumed where auto -> bfloat16
    try:
        with pytest.raises(FingerprintMismatch, match="model_identity.dtype: 'float32' -> 'bfloat16'"):
            prepare_output(spec)
    finally:
        spec_module._describe.cache_clear()


def test_bad_model_fails_before_anything_is_written(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=1)
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "/nope/model", job("generate"))
    with pytest.raises(JobConfigError, match="preset") as info:
        prepare_output(spec)
    assert "/nope/model" in str(info.value) and ".gguf" in str(info.value)
    assert not (tmp_path / "out").exists()

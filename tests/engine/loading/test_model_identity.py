"""One model identity (issue 10, defect 7): weights, config, tokenizer, chat template, generation config
and resolved dtype, computed by the same function for describe_model, loading and the job fingerprint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from prefixflow.engine import LLM, describe_model
from prefixflow.engine.loading.model_identity import ModelNotFoundError

DOCUMENTED_KEYS = {
    "model",
    "format",
    "dtype",
    "weights",
    "files",
    "file",
    "header",
    "preset",
    "digest",
    "quantization",
    "weight_bytes",
    "weight_path",
    "linear_kernel",
}


@pytest.fixture
def model_copy(llama_dir, tmp_path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(llama_dir, target)
    return target


def test_describe_model_equals_the_loaded_models_identity(model_copy):
    described = describe_model(str(model_copy), dtype="float32", device="cpu")
    assert LLM(str(model_copy), dtype="float32", device="cpu").model_identity == described
    assert described["format"] == "hf" and described["dtype"] == "float32"
    assert set(described) <= DOCUMENTED_KEYS
    assert json.loads(json.dumps(described)) == described  # plain JSON


def test_preset_identity_is_the_same_described_and_loaded():
    described = describe_model("tiny", dtype="float32", device="cpu")
    assert described["format"] == "preset" and set(described) <= DOCUMENTED_KEYS
    assert LLM("tiny", dtype="float32", device="cpu").model_identity == described


@pytest.mark.parametrize(
    "name, edit",
    [
        ("chat_template.jinja", lambda text: text.replace("assistant", "model")),
        ("tokenizer_config.json", lambda text: text.replace('"model_max_length"', '"model_max_length_"')),
        ("tokenizer.json", lambda text: text.replace('"<|im_end|>"', '"<|im_fin|>"')),
        ("generation_config.json", lambda text: text.replace("{", '{\n  "temperature": 0.3,', 1)),
    ],
)
def test_editing_the_tokenizer_template_or_generation_config_changes_the_identity(model_copy, name, edit):
    before = describe_model(str(model_copy))
    path = model_copy / name
    edited = edit(path.read_text())
    assert edited != path.read_text()
    path.write_text(edited)
    after = describe_model(str(model_copy))
    assert after["digest"] != before["digest"] and after["files"][name] != before["files"][name]
    assert after["weights"] == before["weights"]


def test_adding_a_chat_template_file_changes_the_identity(model_copy):
    (model_copy / "chat_template.jinja").unlink()
    before = describe_model(str(model_copy))
    (model_copy / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert describe_model(str(model_copy))["digest"] != before["digest"]


def test_a_folder_with_only_pytorch_model_bin_fails_fast_saying_how_to_convert(model_copy):
    (model_copy / "model.safetensors").rename(model_copy / "pytorch_model.bin")
    for fail in (lambda: describe_model(str(model_copy)), lambda: LLM(str(model_copy))):
        with pytest.raises(ModelNotFoundError) as info:
            fail()
        text = str(info.value)
        assert "pytorch_model.bin" in text and "pickled checkpoints are never loaded" in text
        assert "save_pretrained" in text and "convert_hf_to_gguf.py" in text


def test_an_index_naming_a_missing_shard_fails_fast(model_copy):
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (model_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelNotFoundError, match="missing: model-00001-of-00002.safetensors"):
        describe_model(str(model_copy))


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    (tmp_path / "weights.safetensors").write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match="not a .gguf file"):
        describe_model(str(tmp_path / "weights.safetensors"))


def test_gguf_identity_covers_the_chat_template_in_its_header(tmp_path):
    from tests.engine.gguf.test_gguf_loader import CHAT_TEMPLATE, tiny_hf_model, write_gguf

    path = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model())
    before = describe_model(str(path))
    data = path.read_bytes()
    assert data.count(CHAT_TEMPLATE.encode()) == 1
    edited = CHAT_TEMPLATE.replace("assistant", "Assistant").encode()
    path.write_bytes(data.replace(CHAT_TEMPLATE.encode(), edited))  # same size, same weights
    after = describe_model(str(path))
    assert after["header"] != before["header"] and after["weights"] == before["weights"]
    assert LLM(str(path), dtype="float32", device="cpu").model_identity == describe_model(
        str(path), "float32", "cpu"
    )


def test_resuming_a_job_after_editing_the_chat_template_is_refused(model_copy, tmp_path):
    from prefixflow.pipeline import FingerprintMismatch, load_job, prepare_output
    from tests.pipeline.support import job, write_dataset

    write_dataset(tmp_path / "in", files=1)
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), str(model_copy), job("generate"))
    prepare_output(spec)
    template = model_copy / "chat_template.jinja"
    template.write_text(template.read_text().replace("assistant", "model"))
    again = load_job(str(tmp_path / "in"), str(tmp_path / "out"), str(model_copy), job("generate"))
    with pytest.raises(FingerprintMismatch, match="chat_template.jinja"):
        prepare_output(again)

"""``load_gguf_source``: one GGUF file (or a directory holding one) → a format-independent ModelSource."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from gguf import GGUFReader

from prefixflow.engine.gguf.files import find_gguf_file
from prefixflow.engine.gguf.metadata import build_hf_config, field_value
from prefixflow.engine.gguf.tensors import check_tensors, iter_hf_weights, tensor_types
from prefixflow.engine.gguf.tokenizer import build_tokenizer, chat_template, eos_token_ids
from prefixflow.engine.model_source import ModelSource


def load_gguf_source(path: str | Path, dtype: torch.dtype = torch.float32) -> ModelSource:
    """Read a Llama-architecture GGUF: config and tokenizer now, weights lazily through ``weights()``.

    Everything that can be wrong with the file (architecture, tensor types, unknown tensors) is checked
    here, so a bad model fails before the engine allocates anything.
    """
    file = find_gguf_file(path)
    reader = GGUFReader(file)
    hf_config = build_hf_config(reader, dtype)
    check_tensors(reader)
    # the file's block types decide which layers stay packed (engine/quantization/gguf_blocks.py)
    hf_config["quantization_config"] = {"quant_method": "gguf", "tensor_types": tensor_types(reader)}
    template = chat_template(reader)
    identity = file_identity(reader, file)
    return ModelSource(
        name=file.stem,
        hf_config=hf_config,
        weights=lambda: iter_hf_weights(reader, hf_config, dtype),
        tokenizer=build_tokenizer(reader, file, template, cache_key=identity["sha256_head_tail"]),
        eos_token_ids=eos_token_ids(reader),
        chat_template=template,
        identity=identity,
    )


def file_identity(reader: GGUFReader, file: Path) -> dict:
    """What names this model across runs: file name, size, quantization and a hash of head and tail.

    Hashing the first and last MiB (plus the size) tells different files apart without reading
    gigabytes on every start. The absolute path is left out on purpose: the same file installed
    elsewhere (another machine's site-packages) is the same model, so a job can resume there.
    """
    size = file.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with file.open("rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return {
        "format": "gguf",
        "file": file.name,
        "size": size,
        "sha256_head_tail": digest.hexdigest(),
        "general_name": field_value(reader, "general.name", None),
        "file_type": field_value(reader, "general.file_type", None),
    }

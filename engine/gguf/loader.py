"""``load_gguf_source``: one GGUF file (or a directory holding one) → a format-independent ModelSource."""

from __future__ import annotations

from pathlib import Path

import torch

from prefixflow.engine.gguf.files import find_gguf_file
from prefixflow.engine.gguf.metadata import build_hf_config
from prefixflow.engine.gguf.reader import GGUFFile
from prefixflow.engine.gguf.tensors import check_tensors, iter_hf_weights, tensor_types
from prefixflow.engine.gguf.tokenizer import build_tokenizer, chat_template, eos_token_ids
from prefixflow.engine.loading.model_identity import ModelLocation, gguf_digests
from prefixflow.engine.loading.model_source import ModelSource


def load_gguf_source(
    path: str | Path, dtype: torch.dtype = torch.float32, location: ModelLocation | None = None
) -> ModelSource:
    """Read a Llama-architecture GGUF: config and tokenizer now, weights lazily through ``weights()``.

    Everything that can be wrong with the file (architecture, tensor types, unknown tensors) is checked
    here, so a bad model fails before the engine allocates anything.
    """
    file = find_gguf_file(path)
    location = location or ModelLocation(str(path), "gguf", file)
    reader = GGUFFile(file)
    hf_config = build_hf_config(reader, dtype)
    check_tensors(reader)
    # the file's block types decide which layers stay packed (engine/quantization/gguf_blocks.py)
    hf_config["quantization_config"] = {"quant_method": "gguf", "tensor_types": tensor_types(reader)}
    template = chat_template(reader)
    digests = gguf_digests(file)
    content = f"{digests['header']}/{digests['weights'][file.name]}"  # the content, not the file name
    return ModelSource(
        name=file.stem,
        hf_config=hf_config,
        weights=lambda: iter_hf_weights(reader, hf_config, dtype),
        tokenizer=build_tokenizer(reader, file, template, cache_key=content),
        eos_token_ids=eos_token_ids(reader),
        chat_template=template,
        location=location,
    )

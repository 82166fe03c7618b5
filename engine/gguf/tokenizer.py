"""Tokenizer, end-of-sequence ids and chat template of a GGUF model, all from its own metadata."""

from __future__ import annotations

from pathlib import Path

from gguf import GGUFReader

from engine.gguf.metadata import field_value

# llama.cpp keys for tokens that end a turn: plain EOS, end-of-turn (Llama 3 <|eot_id|>), end-of-message.
_EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def eos_token_ids(reader: GGUFReader) -> tuple[int, ...]:
    """Every id the metadata marks as ending generation, first the plain EOS, without duplicates."""
    ids: list[int] = []
    for key in _EOS_KEYS:
        value = field_value(reader, key, None)
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    return tuple(ids)


def chat_template(reader: GGUFReader) -> str | None:
    return field_value(reader, "tokenizer.chat_template", None)


def build_tokenizer(reader: GGUFReader, path: Path, template: str | None) -> object:
    """The fast tokenizer transformers builds from the GGUF vocabulary and merges (no hub access).

    The chat template is set from the metadata explicitly, so it does not depend on which transformers
    release copies it over.
    """
    from transformers import AutoTokenizer

    if "tokenizer.ggml.tokens" not in reader.fields:
        raise ValueError(f"GGUF file {str(path)!r} has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if template is not None:
        tok.chat_template = template
    return tok

"""Tokenizer, end-of-sequence ids and chat template of a GGUF model, all from its own metadata."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from prefixflow.engine.gguf.metadata import field_value
from prefixflow.engine.gguf.reader import GGUFFile

# llama.cpp keys for tokens that end a turn: plain EOS, end-of-turn (Llama 3 <|eot_id|>), end-of-message.
_EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def eos_token_ids(reader: GGUFFile) -> tuple[int, ...]:
    """Every id the metadata marks as ending generation, first the plain EOS, without duplicates."""
    ids: list[int] = []
    for key in _EOS_KEYS:
        value = field_value(reader, key, None)
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    return tuple(ids)


def chat_template(reader: GGUFFile) -> str | None:
    value = field_value(reader, "tokenizer.chat_template", None)
    return None if value is None else str(value)


def build_tokenizer(reader: GGUFFile, path: Path, template: str | None, cache_key: str | None = None) -> Any:
    """The fast tokenizer transformers builds from the GGUF vocabulary and merges (no hub access).

    Building it re-parses the file and converts the vocabulary (about 5 s for a 49k vocabulary), so
    the result is saved once under the prefixflow cache, keyed by the file's content hash and the
    transformers/tokenizers versions, and later loads read that (about 0.2 s). The chat template is
    set from the metadata explicitly, so it does not depend on which transformers release copies it.
    """
    from transformers import AutoTokenizer

    if "tokenizer.ggml.tokens" not in reader.fields:
        raise ValueError(f"GGUF file {str(path)!r} has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    cached = _cache_dir(cache_key) if cache_key else None
    tok = cached_tokenizer(cache_key) if cache_key else None
    if tok is None:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        if cached is not None:
            _save(tok, cached)
    if template is not None:
        tok.chat_template = template
    return tok


def cached_tokenizer(cache_key: str) -> Any:
    """The tokenizer an earlier ``build_tokenizer`` saved for this file, or None (chat template not set)."""
    from transformers import AutoTokenizer

    cached = _cache_dir(cache_key)
    if not (cached / "tokenizer.json").is_file():
        return None
    return AutoTokenizer.from_pretrained(str(cached))


def _cache_dir(cache_key: str) -> Path:
    import tokenizers
    import transformers

    from prefixflow.engine.loading.presets import cache_dir

    versions = f"{transformers.__version__}/{tokenizers.__version__}"
    key = hashlib.sha256(f"{cache_key}/{versions}".encode()).hexdigest()[:24]
    return cache_dir() / "gguf-tokenizers" / key


def _save(tok: Any, target: Path) -> None:
    """Write to a temporary sibling and rename, so a concurrent reader never sees half a tokenizer.

    A cache that cannot be written (read-only home, full disk) only costs time, never the load.
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
        tok.save_pretrained(str(tmp))
        try:
            tmp.rename(target)
        except OSError:  # another process saved it first
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass

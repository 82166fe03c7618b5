"""Trim the broken character that ends a generation cut inside a multi-byte UTF-8 sequence.

Byte-level tokenizers split one character over several tokens (an emoji is 4 bytes). When
``max_tokens`` (or the context limit) stops a request between those tokens, the decoded text ends in
U+FFFD. Only the tokens' bytes tell that apart from a model that really generated U+FFFD, so the
trim happens only when the output's bytes end with an incomplete sequence; the token ids are kept.
"""

from __future__ import annotations

import codecs
import json
import re
from functools import lru_cache
from typing import Any

REPLACEMENT = "\ufffd"
_TAIL_TOKENS = 8  # an incomplete sequence is at most 3 bytes, so the last few tokens always cover it
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's): printable Latin-1 bytes stand for themselves, the
    other 68 bytes are shifted to code points 256 and up, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


def _decoder_kinds(tokenizer: Any) -> set[str]:
    """Decoder types of a fast tokenizer (``ByteLevel``, ``ByteFallback``, ...); empty when unknown."""
    try:
        spec = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {}
    except Exception:  # slow tokenizers, custom objects: no byte view, no trimming
        return set()
    kinds = {spec.get("type")}
    kinds |= {d.get("type") for d in spec.get("decoders") or []}
    return {k for k in kinds if k}


def _token_bytes(token: str, kinds: set[str]) -> bytes | None:
    if "ByteLevel" in kinds:
        table = _byte_level_alphabet()
        if all(ch in table for ch in token):
            return bytes(table[ch] for ch in token)
        return token.encode("utf-8")  # an added token written as plain text
    if "ByteFallback" in kinds:
        m = _BYTE_TOKEN.fullmatch(token)
        return bytes([int(m.group(1), 16)]) if m else token.replace("\u2581", " ").encode("utf-8")
    return None


def ends_incomplete(tokenizer: Any, token_ids: list[int], skip_special_tokens: bool = True) -> bool:
    """True when the bytes of ``token_ids`` end in the beginning of a multi-byte character."""
    kinds = _decoder_kinds(tokenizer)
    if not kinds & {"ByteLevel", "ByteFallback"}:
        return False
    special = set(getattr(tokenizer, "all_special_ids", ()) or ()) if skip_special_tokens else set()
    tail = [t for t in token_ids if t not in special][-_TAIL_TOKENS:]
    # An id the tokenizer does not know (a model vocabulary padded past the tokenizer's) decodes to
    # nothing, as in ``tokenizer.decode``.
    pieces = [_token_bytes(tok, kinds) for tok in tokenizer.convert_ids_to_tokens(tail) if tok is not None]
    if any(p is None for p in pieces):
        return False
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(b"".join(p for p in pieces if p is not None), final=False)
    return bool(decoder.getstate()[0])  # bytes still waiting for the rest of their character


def trim_incomplete_utf8(
    text: str, tokenizer: Any, token_ids: list[int], skip_special_tokens: bool = True
) -> str:
    """``text`` without the final U+FFFD when that character stands for an incomplete byte sequence."""
    if text.endswith(REPLACEMENT) and ends_incomplete(tokenizer, token_ids, skip_special_tokens):
        return text[: -len(REPLACEMENT)]
    return text

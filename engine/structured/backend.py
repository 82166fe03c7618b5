"""The grammar engine behind structured outputs: xgrammar, imported only when a request needs it.

xgrammar was chosen over llguidance by measurement on this project's workload (benchmarks/
grammar_engines.py, RESULTS.md): 3-25x faster mask fills per request, 4x faster tokenizer setup. It stays
optional at run time: without it the engine imports and runs, and only constrained requests fail with
the install command.
"""

from __future__ import annotations

import json
import re
from typing import Any

from prefixflow.engine.structured.params import StructuredOutputs

REQUIREMENT = "xgrammar>=0.2.8,<0.3"
_CPP_PREFIX = re.compile(r"^\[[\d:]+\] \S+\.(?:cc|h):\d+: (?:Check failed: \(error\.empty\(\)\) is false: )?")


class StructuredOutputsUnavailable(RuntimeError):
    """The grammar engine is not installed."""


class GrammarError(ValueError):
    """A schema, regex or grammar the grammar engine cannot compile; the message says why."""


def xgrammar() -> Any:
    try:
        import xgrammar as xgr
    except ImportError as exc:
        raise StructuredOutputsUnavailable(
            f"structured outputs need the xgrammar package, which cannot be imported ({exc}); "
            f"install it with: pip install '{REQUIREMENT}'"
        ) from None
    return xgr


def clean_message(exc: BaseException) -> str:
    """xgrammar's C++ errors start with a timestamp and a source location; keep what the user can act on."""
    lines = [_CPP_PREFIX.sub("", line).strip() for line in str(exc).strip().splitlines()]
    return " ".join(line for line in lines if line) or type(exc).__name__


def choice_grammar(options: tuple[str, ...] | list[str]) -> str:
    """EBNF for 'exactly one of these strings' (string literals escaped for xgrammar's EBNF)."""
    return "root ::= " + " | ".join(_ebnf_literal(o) for o in options)


def _ebnf_literal(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# xgrammar 0.2.9 compiles a string with maxLength/minLength to ``X_characters{m, n}`` over this class,
# which admits raw control characters (U+0000-U+001F other than CR/LF) and no escapes: "\t" or
# "\x17" inside the string, which no JSON parser accepts. Each such rule is rewritten to one JSON
# string character: an unescaped character JSON allows, or an escape (still one character each).
_BOUNDED_CHARS = re.compile(r'^(?P<name>\S+_characters) ::= \(\(\[\^\\"\\\\\\r\\n\]\)\)$', re.M)
_JSON_CHAR = (
    r'(([^\0-\x1f\"\\]) | ("\\" [\"\\/bfnrt]) | ("\\u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]))'
)
# A repetition ``{m, n}`` of that alternation is not covered by xgrammar's precomputed token masks: every
# mask inside such a string checks the whole vocabulary at run time (28 ms per token for SmolLM2's 49k
# ids against 0.1 ms; RESULTS.md, issue 27). So the string's use site is unrolled into one rule per
# character count (``X_at_j``: j characters so far; another character, or the closing quote once j >= m),
# the same language, whose masks are precomputed. Up to ``MAX_UNROLLED`` characters (the rules cost
# compile time, about linear in n); a longer bound keeps the repetition.
MAX_UNROLLED = 256
_BOUNDED_USE = re.compile(r'"\\"" (?P<name>\S+_characters)\{(?P<lo>\d+), (?P<hi>-?\d+)\} "\\""')


def _unrolled(char: str, prefix: str, lo: int, hi: int) -> list[str]:
    """Rules ``prefix_at_0 .. prefix_at_hi``: a string body of lo..hi ``char``s, then its closing quote."""
    rules = []
    for j in range(hi + 1):
        options = [f"({char} {prefix}_at_{j + 1})"] if j < hi else []
        if j >= lo:
            options.append('("\\"")')
        rules.append(f"{prefix}_at_{j} ::= ({' | '.join(options)})")
    return rules


def json_legal_strings(grammar: Any) -> Any:
    """``grammar`` with every bounded-string character rule limited to JSON-legal characters, and each
    bounded string of at most ``MAX_UNROLLED`` characters unrolled (the same grammar when it has none)."""
    text = str(grammar)
    fixed, count = _BOUNDED_CHARS.subn(lambda m: f"{m.group('name')} ::= {_JSON_CHAR}", text)
    if not count:
        return grammar
    added: dict[str, list[str]] = {}

    def unroll(m: re.Match[str]) -> str:
        char, lo, hi = m.group("name"), int(m.group("lo")), int(m.group("hi"))
        prefix = f"{char}_{lo}_{hi}"
        if not 0 <= lo <= hi <= MAX_UNROLLED or f"{prefix}_at_" in text:
            return m.group(0)  # unbounded, too long, or a name the grammar already uses: keep the repetition
        if prefix not in added:
            added[prefix] = _unrolled(char, prefix, lo, hi)
        return f'"\\"" {prefix}_at_0'

    fixed = _BOUNDED_USE.sub(unroll, fixed)
    if added:
        fixed = fixed.rstrip("\n") + "\n" + "\n".join(r for rules in added.values() for r in rules) + "\n"
    return xgrammar().Grammar.from_ebnf(fixed)


def build_grammar(so: StructuredOutputs) -> Any:
    """The constraint as an xgrammar ``Grammar`` (needs no tokenizer); raises GrammarError naming the problem."""
    problem = so.validation_error()
    if problem:
        raise GrammarError(problem)
    xgr = xgrammar()
    kind = so.kind
    try:
        if kind == "json_schema":
            return json_legal_strings(
                xgr.Grammar.from_json_schema(
                    json.dumps(so.schema()), any_whitespace=so.any_whitespace, strict_mode=True
                )
            )
        if kind == "json_object":
            schema = {"type": "object"}
            return xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=so.any_whitespace)
        if kind == "regex":
            return xgr.Grammar.from_regex(so.regex)
        if kind == "choice":
            return xgr.Grammar.from_ebnf(choice_grammar(tuple(so.choice or ())))
        return xgr.Grammar.from_ebnf(so.grammar)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise GrammarError(f"invalid {kind.replace('_', ' ')}: {clean_message(exc)}") from None


def structured_outputs_error(so: StructuredOutputs) -> str | None:
    """Why this constraint cannot be used (malformed, does not compile, no grammar engine), or None.

    Needs no model: the pipeline calls it to fail a job with a bad schema or regex before loading one.
    """
    try:
        build_grammar(so)
    except (GrammarError, StructuredOutputsUnavailable) as exc:
        return str(exc)
    return None


def tokenizer_info(tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> Any:
    """xgrammar's view of the model's vocabulary: each id's bytes, the ids never allowed, and the ids that
    end generation (allowed exactly when the grammar is complete).

    ``tokenizer`` is the transformers fast tokenizer the engine loaded, from an HF directory or built
    from a GGUF file's own vocabulary (engine/gguf/tokenizer.py). ``vocab_size`` is the model's (logits
    width), which may exceed the tokenizer's; the extra ids are never allowed. Special tokens
    (``<|im_start|>`` ...) are blanked so they are never allowed either: xgrammar would otherwise treat
    their text as literal characters, and the decoded output (which skips them) would not match.
    """
    xgr = xgrammar()
    try:
        detected = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(eos_ids) or None
        )
        vocab = [""] * vocab_size
        for text, token_id in tokenizer.get_vocab().items():
            if token_id < vocab_size:
                vocab[token_id] = text
        for token_id in special_token_ids(tokenizer):
            if token_id < vocab_size:
                vocab[token_id] = ""
        return xgr.TokenizerInfo.from_vocab_and_metadata(vocab, detected.dump_metadata())
    except (RuntimeError, ValueError, TypeError, AttributeError) as exc:
        raise StructuredOutputsUnavailable(
            f"cannot build the grammar engine's tokenizer info from this model's tokenizer: {clean_message(exc)}"
        ) from None


def special_token_ids(tokenizer: Any) -> set[int]:
    ids = {int(i) for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items() if tok.special}
    return ids | {int(i) for i in getattr(tokenizer, "all_special_ids", ())}

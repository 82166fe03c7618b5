"""Structured outputs on the tiny preset (random weights, byte-level BPE tokenizer) and a tiny GGUF model:
outputs obey their constraint, the mask never hides an allowed argmax, EOS is allowed exactly when the
grammar can end, and matcher state survives preemption, prefix caching and batching."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest
import torch

import prefixflow.engine
from prefixflow.engine import LLM, SamplingParams, StructuredOutputs, structured_outputs_error
from prefixflow.engine.structured.backend import tokenizer_info
from prefixflow.engine.structured.bitmask import allowed_tokens, apply_bitmask_, unpack_with_table
from prefixflow.engine.structured.manager import StructuredOutputManager

# Bounded everywhere (enum, integer range, maxItems), so even random weights finish inside max_tokens.
SCHEMA = {
    "type": "object",
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "verified": {"type": "boolean"},
        "meta": {
            "type": "object",
            "properties": {"lang": {"type": "string", "enum": ["en", "de"]}},
            "required": ["lang"],
        },
        "tags": {"type": "array", "items": {"type": "string", "enum": ["price", "battery"]}, "maxItems": 3},
    },
    "required": ["sentiment", "stars", "verified", "meta", "tags"],
}
PROMPTS = [f"review number {i}: the battery is {'good' if i % 2 else 'bad'}" for i in range(10)]


def json_params(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=100, structured=StructuredOutputs(json_schema=SCHEMA), **kw)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_model_len=256)


def test_json_schema_outputs_parse_and_validate(llm):
    outs = llm.generate(PROMPTS, json_params())
    for out in outs:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)
        assert out.token_ids[-1] in llm.engine.eos_ids  # ended because the grammar allowed EOS
    assert llm.stats().masked_steps > 0


BOUNDED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 12},
        "notes": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["name", "notes"],
}


def test_bounded_strings_hold_only_json_legal_characters(llm):
    """xgrammar 0.2.9's rule for maxLength/minLength strings admits raw control characters (a tab, \x06),
    which the tiny model's byte-level vocabulary emits readily; every output must parse."""
    so = StructuredOutputs(json_schema=BOUNDED)
    params = [SamplingParams(max_tokens=120, temperature=1.0, seed=s, structured=so) for s in range(12)]
    outs = llm.generate(PROMPTS[:6] * 2, params)
    for out in outs:
        assert out.finish_reason == "stop", out.text
        value = json.loads(out.text)  # strict: a raw control character inside a string fails here
        jsonschema.validate(value, BOUNDED)
        assert not any(ord(c) < 0x20 for c in out.text)  # no raw control character anywhere


def test_grammar_end_finishes_a_request_of_a_model_that_lists_no_eos():
    """A model source without EOS ids (as the benchmarks build them): the tokenizer's EOS ends the grammar,
    and the request finishes there instead of failing on the next token."""
    from dataclasses import replace

    from prefixflow.engine.loading.loader import resolve_model

    source = replace(resolve_model("tiny"), eos_token_ids=())
    no_eos = LLM(source, max_model_len=256)
    outs = no_eos.generate(PROMPTS[:3], json_params())
    for out in outs:
        assert out.finish_reason == "stop", (out.error, out.text)
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_choice_regex_and_ebnf_grammar(llm):
    choices = ['say "yes"', "no\\way", "naïve"]
    cases = [
        (StructuredOutputs(choice=choices), lambda t: t in choices),
        (StructuredOutputs(regex=r"[a-c]{2,4}-\d{3}"), lambda t: re.fullmatch(r"[a-c]{2,4}-\d{3}", t)),
        (
            StructuredOutputs(grammar='root ::= "(" item ("," item)* ")"\nitem ::= [0-9] | "x"'),
            lambda t: re.fullmatch(r"\((?:[0-9]|x)(?:,(?:[0-9]|x))*\)", t),
        ),
        (StructuredOutputs(json_object=True), lambda t: isinstance(json.loads(t), dict)),
    ]
    for so, ok in cases:
        for out in llm.generate(
            PROMPTS[:4], SamplingParams(max_tokens=60, temperature=0.8, seed=7, structured=so)
        ):
            if out.finish_reason == "stop":
                assert ok(out.text), (so, out.text)
            else:  # unbounded grammars may run out of tokens on random weights; never on bounded ones
                assert so.kind in ("grammar", "json_object") and out.finish_reason == "length"
        if so.kind in ("choice", "regex"):
            assert all(
                o.finish_reason == "stop" for o in llm.generate(PROMPTS[:4], SamplingParams(structured=so))
            )


def test_eos_is_allowed_exactly_when_the_grammar_can_end(llm):
    eng = llm.engine
    manager = StructuredOutputManager(eng.tokenizer, eng.model_cfg.vocab_size, eng.eos_ids, 4)
    matcher = manager.new_matcher(StructuredOutputs(choice=["ab", "abcd"]))
    eos = eng.eos_ids[0]
    specials = [i for i in eng.tokenizer.all_special_ids if i not in eng.eos_ids]
    mask = torch.full((1, (eng.model_cfg.vocab_size + 31) // 32), -1, dtype=torch.int32)
    seen = []
    for char in "abcd":
        matcher.fill_next_token_bitmask(mask, 0)
        allowed = allowed_tokens(mask, eng.model_cfg.vocab_size, torch.device("cpu"))[0]
        seen.append(bool(allowed[eos]))
        assert not allowed[specials].any()  # <|im_start|> etc. are never text
        (token,) = eng.tokenizer.encode(char, add_special_tokens=False)
        assert allowed[token] and matcher.accept_token(token)
    matcher.fill_next_token_bitmask(mask, 0)
    allowed = allowed_tokens(mask, eng.model_cfg.vocab_size, torch.device("cpu"))[0]
    seen.append(bool(allowed[eos]))
    assert seen == [False, False, True, False, True]  # "", "a", "ab" (may end), "abc", "abcd" (must end)
    assert allowed.sum() == len(eng.eos_ids)


def _clean_prefix(llm, token_ids: tuple[int, ...]) -> int:
    """How many leading tokens are plain text on their own (no specials, whole UTF-8 characters): random
    weights also emit lone bytes, which no string constraint can spell."""
    specials = set(llm.tokenizer.all_special_ids)
    for k, token in enumerate(token_ids):
        if token in specials or "\ufffd" in llm.tokenizer.decode([token]):
            return k
    return len(token_ids)


def test_mask_never_removes_a_legal_argmax(llm):
    """When the free greedy output already satisfies a constraint, the constrained greedy output is the same."""
    words = "the battery of this phone lasts two days and the screen is bright enough for sunlight".split()
    prompts = [" ".join(words[i : i + 5]) for i in range(len(words) - 4)]
    checked = 0
    for prompt, out in zip(prompts, llm.generate(prompts, SamplingParams(max_tokens=12))):
        k = _clean_prefix(llm, out.token_ids)
        if k < 3:
            continue
        checked += 1
        text = llm.tokenizer.decode(out.token_ids[:k])
        constraints = [
            StructuredOutputs(choice=[text, text + "!", "something else"]),
            StructuredOutputs(regex=re.escape(text) + "|zz+"),
            StructuredOutputs(grammar="root ::= [^\\x00]*"),
        ]
        for so in constraints:
            got = llm.generate([prompt], SamplingParams(max_tokens=k, structured=so))[0]
            assert got.token_ids == out.token_ids[:k], (so, text, got.text)
    assert checked >= 5


def test_preemption_mid_request_then_identical_output():
    big = LLM("tiny", max_model_len=256)
    expected = [o.token_ids for o in big.generate(PROMPTS, json_params())]
    small = LLM("tiny", max_model_len=256, num_kv_blocks=40, block_size=4)  # 160 slots for 10 requests
    outs = small.generate(PROMPTS, json_params())
    assert small.stats().preemptions > 0
    assert [o.token_ids for o in outs] == expected
    assert all(o.finish_reason == "stop" for o in outs)


def test_fills_on_the_worker_thread_give_the_same_tokens(monkeypatch):
    """Fills above the threshold run on the worker while the model runs; force that path everywhere."""
    from prefixflow.engine.structured import manager

    inline = LLM("tiny", max_model_len=256)
    expected = [o.token_ids for o in inline.generate(PROMPTS, json_params(temperature=0.9, seed=5))]
    monkeypatch.setattr(manager, "OVERLAP_ABOVE_S", 0.0)
    overlapped = LLM("tiny", max_model_len=256, num_kv_blocks=40, block_size=4)  # with preemption too
    assert [
        o.token_ids for o in overlapped.generate(PROMPTS, json_params(temperature=0.9, seed=5))
    ] == expected
    stats = overlapped.stats()
    assert stats.mask_overlapped_steps == stats.masked_steps > 0 and stats.preemptions > 0


def test_prefix_cache_hits_leave_constrained_output_unchanged(llm):
    shared = "a long shared instruction that several rows start with, " * 3
    prompts = [shared + p for p in PROMPTS[:6]]
    first = [o.token_ids for o in llm.generate(prompts, json_params())]
    again = llm.generate(prompts, json_params())
    assert sum(o.num_cached_tokens for o in again) > 0
    assert [o.token_ids for o in again] == first
    no_cache = LLM("tiny", max_model_len=256, enable_prefix_caching=False)
    assert [o.token_ids for o in no_cache.generate(prompts, json_params())] == first


def test_seeded_constrained_sampling_is_batch_invariant(llm):
    seeded = json_params(temperature=1.0, top_p=0.95, seed=1234)
    alone = llm.generate([PROMPTS[3]], seeded)[0].token_ids
    others = [SamplingParams(max_tokens=20, temperature=1.0), json_params(temperature=0.7)]
    batch = llm.generate(PROMPTS, [seeded if i == 3 else others[i % 2] for i in range(len(PROMPTS))])
    assert batch[3].token_ids == alone
    jsonschema.validate(json.loads(batch[3].text), SCHEMA)


@pytest.mark.parametrize(
    "so, extra, words",
    [
        (StructuredOutputs(regex="[a-"), {}, ["invalid regex", "Unclosed '['"]),
        (StructuredOutputs(regex="(abc"), {}, ["invalid regex", "parenthesis"]),
        (StructuredOutputs(json_schema={"type": "objekt"}), {}, ["invalid json schema", "objekt"]),
        (StructuredOutputs(json_schema={"type": "integer", "minimum": 5, "maximum": 1}), {}, ["minimum"]),
        (StructuredOutputs(json_schema="{not json"), {}, ["not valid JSON"]),
        (StructuredOutputs(json_schema=["a"]), {}, ["must be a JSON object"]),
        (StructuredOutputs(grammar='root ::= "a" | b'), {}, ["invalid grammar", 'Rule "b" is not defined']),
        (StructuredOutputs(choice=[]), {}, ["non-empty list"]),
        (StructuredOutputs(choice=["a", "a"]), {}, ["unique"]),
        (StructuredOutputs(regex="a", choice=["a"]), {}, ["exactly one", "regex, choice"]),
        (StructuredOutputs(), {}, ["exactly one", "none"]),
        (StructuredOutputs(regex="a+"), {"ignore_eos": True}, ["ignore_eos"]),
        (StructuredOutputs(regex="a+"), {"min_tokens": 2}, ["min_tokens"]),
        ({"regex": "a+"}, {}, ["StructuredOutputs"]),
    ],
)
def test_bad_constraints_are_error_outputs_and_others_finish(llm, so, extra, words):
    bad = SamplingParams(max_tokens=8, structured=so, **extra)
    outs = llm.generate(["first", "second"], [bad, SamplingParams(max_tokens=3)])
    assert outs[0].finish_reason == "error"
    for word in words:
        assert word in outs[0].error, outs[0].error
    assert outs[1].finish_reason == "length"
    if isinstance(so, StructuredOutputs) and not extra:  # the model-free check says the same, up front
        assert all(word in (structured_outputs_error(so) or "") for word in words)


def test_bitmask_unpacking_matches_bit_arithmetic():
    vocab = 100  # not a multiple of 32: the last word is partly padding
    gen = torch.Generator().manual_seed(0)
    mask = torch.randint(-(2**31), 2**31 - 1, (3, 4), dtype=torch.int32, generator=gen)
    mask[1] = -1  # an unconstrained row
    expected = torch.tensor(
        [[(int(mask[r, t // 32]) >> (t % 32)) & 1 for t in range(vocab)] for r in range(3)]
    ).bool()
    assert torch.equal(allowed_tokens(mask, vocab, torch.device("cpu")), expected)
    assert torch.equal(unpack_with_table(mask, vocab), expected)  # the GPU path's arithmetic, on the CPU
    for dtype in (torch.float32, torch.float64):  # numpy's masked copy, then the masked_fill_ path
        logits = torch.randn(3, vocab, generator=gen, dtype=dtype)
        masked = logits.clone()
        apply_bitmask_(masked, mask)
        assert torch.equal(masked[expected], logits[expected])
        assert torch.isneginf(masked[~expected]).all()
        assert torch.equal(masked[1], logits[1])


def _tokenizer_bytes(tok, token_id: int) -> bytes:
    """A byte-level BPE token's bytes, from the tokenizer's own byte decoder."""
    text = tok.decode([token_id], clean_up_tokenization_spaces=False)
    return text.encode("utf-8")


def _check_tokenizer_info(tok, vocab_size: int, eos: tuple[int, ...]) -> None:
    info = tokenizer_info(tok, vocab_size, eos)
    assert info.vocab_size == vocab_size
    assert sorted(info.stop_token_ids) == sorted(eos)
    specials = set(tok.all_special_ids) - set(eos)
    assert specials <= set(info.special_token_ids)
    decoded = info.decoded_vocab
    checked = 0
    for token_id in range(len(tok)):
        if token_id in specials or token_id in eos:
            continue
        text = tok.decode([token_id], clean_up_tokenization_spaces=False)
        if "\ufffd" not in text:  # a whole character: compare with the tokenizer's own decoding
            assert decoded[token_id] == text.encode("utf-8"), token_id
            checked += 1
    assert checked > len(tok) // 3
    assert all(decoded[i] == b"" for i in range(len(tok), vocab_size))  # padding ids: never allowed


def test_tokenizer_info_from_an_hf_directory_tokenizer(llm):
    _check_tokenizer_info(llm.tokenizer, llm.engine.model_cfg.vocab_size, llm.engine.eos_ids)
    _check_tokenizer_info(llm.tokenizer, llm.engine.model_cfg.vocab_size + 29, llm.engine.eos_ids)


def test_tokenizer_info_and_generation_from_a_gguf_tokenizer(tmp_path, monkeypatch):
    from tests.engine.gguf.test_gguf_loader import tiny_hf_model, write_gguf

    monkeypatch.setenv("PREFIXFLOW_CACHE", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model())
    gguf_llm = LLM(str(path), dtype="float32", device="cpu")
    eng = gguf_llm.engine
    _check_tokenizer_info(eng.tokenizer, eng.model_cfg.vocab_size, eng.eos_ids)
    so = StructuredOutputs(choice=["the cat", "in a hat"])
    outs = gguf_llm.generate([[5, 60, 70, 80], [30, 31, 32]], SamplingParams(structured=so))
    assert all(o.finish_reason == "stop" and o.text in ("the cat", "in a hat") for o in outs)


class _BlockXgrammar:
    def find_spec(self, name, path=None, target=None):
        if name == "xgrammar" or name.startswith("xgrammar."):
            raise ImportError("No module named 'xgrammar' (blocked by the test)")


def test_engine_runs_without_the_grammar_engine_and_constrained_requests_say_how_to_fix_it(monkeypatch):
    for name in [m for m in sys.modules if m == "xgrammar" or m.startswith("xgrammar.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_BlockXgrammar(), *sys.meta_path])
    with pytest.raises(ImportError):
        import xgrammar  # noqa: F401
    llm = LLM("tiny", max_model_len=64)  # a fresh engine: its grammar backend is not built yet
    free, bound = llm.generate(
        ["a", "b"], [SamplingParams(max_tokens=2), SamplingParams(structured=StructuredOutputs(regex="a+"))]
    )
    assert free.finish_reason == "length"
    assert bound.finish_reason == "error"
    for message in (bound.error, structured_outputs_error(StructuredOutputs(regex="a+"))):
        assert "xgrammar" in message and "pip install 'xgrammar" in message


def test_no_engine_module_imports_the_grammar_engine_at_import_time():
    """The engine must import on a machine without xgrammar: every import of it sits inside a function."""
    root = Path(prefixflow.engine.__file__).resolve().parent
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only; imports inside functions are lazy
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] in ("xgrammar", "llguidance") for n in names), path

"""Stops as vLLM defines them: ``min_tokens`` holds stop strings back too, the text is cut at the
occurrence that ended the request, a stop token's text is not in the output, and ``text`` always
agrees with ``token_ids``. The reference is a plain walk over the greedy tokens with the tokenizer."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixflow.engine import LLM, SamplingParams
from prefixflow.engine.loading.presets import materialize

PROMPTS = ["hello world", "stops and starts", "a third prompt"]
MAX = 32


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_model_len=256)


@pytest.fixture(scope="module")
def greedy(llm):
    """Each prompt's greedy output without any stop, and the text after each prefix of it."""
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX, ignore_eos=True))
    tok = llm.engine.tokenizer
    return {
        p: (list(o.token_ids), [tok.decode(list(o.token_ids[:k])) for k in range(MAX + 1)])
        for p, o in zip(PROMPTS, outs)
    }


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def reference_stop(texts: list[str], stops: list[str], min_tokens: int, include: bool):
    """(tokens, text, stop) of vLLM's rule: the first token k >= min_tokens whose added text ends an
    occurrence of a stop string; the text is cut at that occurrence (the earliest, when several end
    in token k's text, the first listed on a tie). None when no stop string ends anywhere past min_tokens."""
    for k in range(max(1, min_tokens), len(texts)):
        new_from = _common_prefix(texts[k - 1], texts[k])  # what token k added (or completed)
        hits = []
        for order, s in enumerate(stops):
            at = texts[k].find(s)
            while at >= 0:
                if at + len(s) > new_from:
                    hits.append((at, order, s))
                    break
                at = texts[k].find(s, at + 1)
        if hits:
            at, _, s = min(hits)  # the earliest; on a tie, the first listed
            return k, texts[k][: at + (len(s) if include else 0)], s
    return None


def test_min_tokens_ignores_a_stop_string_that_appears_earlier(llm, greedy):
    """The issue's case: the stop string first appears before min_tokens. Today's main returned all
    min_tokens ids with text cut at that early occurrence (text and token_ids disagree)."""
    ids, texts = greedy[PROMPTS[0]]
    stop = next(texts[k][-2:] for k in range(6, MAX) if len(texts[k]) >= 2 and "\ufffd" not in texts[k][-2:])
    min_tokens = MAX - 4
    out = llm.generate(
        [PROMPTS[0]],
        SamplingParams(
            max_tokens=MAX, ignore_eos=True, stop=[stop], min_tokens=min_tokens, skip_special_tokens=False
        ),
    )[0]
    assert stop in texts[min_tokens - 1]  # the early occurrence this is about
    assert out.num_output_tokens >= min_tokens
    expected = reference_stop(texts, [stop], min_tokens, include=False)
    if expected is None:
        assert (out.finish_reason, out.text, len(out.token_ids)) == ("length", texts[MAX], MAX)
    else:
        assert (len(out.token_ids), out.text, out.stop_reason) == expected


def _stop_strings(texts: list[str]):
    """Stop strings cut from the greedy text (so they hit), or random short ones."""
    full = texts[-1]
    cut = st.tuples(st.integers(0, len(full) - 1), st.integers(1, 4)).map(lambda t: full[t[0] : t[0] + t[1]])
    return st.lists(
        st.one_of(cut, st.text(alphabet="abcde ", min_size=1, max_size=3)), min_size=1, max_size=3
    )


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_text_and_token_ids_agree_for_any_stop_strings(llm, greedy, data):
    tok = llm.engine.tokenizer
    cases = []
    for prompt in PROMPTS * 2:
        ids, texts = greedy[prompt]
        stops = [s for s in data.draw(_stop_strings(texts)) if s and "\ufffd" not in s] or ["zz"]
        min_tokens = data.draw(st.integers(0, MAX))
        include = data.draw(st.booleans())
        cases.append((prompt, stops, min_tokens, include))
    params = [
        SamplingParams(
            max_tokens=MAX,
            ignore_eos=True,
            stop=s,
            min_tokens=m,
            include_stop_str_in_output=i,
            skip_special_tokens=False,
        )
        for _, s, m, i in cases
    ]
    outs = llm.generate([c[0] for c in cases], params)
    for (prompt, stops, min_tokens, include), out in zip(cases, outs):
        ids, texts = greedy[prompt]
        assert list(out.token_ids) == ids[: len(out.token_ids)]  # stop strings never change the tokens
        assert out.num_output_tokens >= min_tokens
        full = tok.decode(list(out.token_ids), skip_special_tokens=False)
        assert full.startswith(out.text)
        expected = reference_stop(texts, stops, min_tokens, include)
        if expected is None:
            assert (out.finish_reason, out.text, len(out.token_ids)) == ("length", full, MAX)
        else:
            assert (len(out.token_ids), out.text, out.stop_reason, out.finish_reason) == (*expected, "stop")
            rest = full[len(out.text) :]
            assert out.text.endswith(expected[2]) if include else rest.startswith(expected[2])


def test_stop_token_text_is_dropped_unless_included(llm, greedy):
    ids, texts = greedy[PROMPTS[0]]
    tok = llm.engine.tokenizer
    # a stop token whose preceding text is whole characters (else that incomplete tail is trimmed too)
    first = next(
        k
        for k in range(4, MAX)
        if ids[k] not in ids[:k] and not texts[k].endswith("\ufffd") and not texts[k + 1].endswith("\ufffd")
    )
    stop_at = ids[first]
    for include in (False, True):
        out = llm.generate(
            [PROMPTS[0]],
            SamplingParams(
                max_tokens=MAX, ignore_eos=True, stop_token_ids=[stop_at], include_stop_str_in_output=include
            ),
        )[0]
        assert out.token_ids == tuple(ids[: first + 1]) and out.stop_reason == stop_at  # the id stays
        kept = ids[: first + 1] if include else ids[:first]
        assert out.text == tok.decode(kept, skip_special_tokens=True)


@pytest.fixture(scope="module")
def im_end_llm(tmp_path_factory):
    """The tiny preset with ``<|im_end|>`` as an end-of-sequence token, as chat models ship it."""
    target = tmp_path_factory.mktemp("im_end") / "tiny"
    shutil.copytree(materialize("tiny"), target)
    import json

    gen = json.loads((target / "generation_config.json").read_text())
    gen["eos_token_id"] = [gen["eos_token_id"], 2]
    (target / "generation_config.json").write_text(json.dumps(gen))
    return LLM(os.fspath(target), max_model_len=256)


def test_end_of_sequence_special_token_is_not_in_the_text(im_end_llm, greedy):
    """vLLM stops before the EOS token (``<|im_end|>``) even with skip_special_tokens=False."""
    ids, _ = greedy[PROMPTS[0]]
    tok = im_end_llm.engine.tokenizer
    assert tok.convert_ids_to_tokens(2) == "<|im_end|>" and 2 in ids, (
        "the greedy output must reach <|im_end|>"
    )
    first = ids.index(2)
    out = im_end_llm.generate([PROMPTS[0]], SamplingParams(max_tokens=MAX, skip_special_tokens=False))[0]
    assert out.finish_reason == "stop" and out.stop_reason is None
    assert out.token_ids == tuple(ids[: first + 1])
    assert out.text == tok.decode(ids[:first], skip_special_tokens=False) and "<|im_end|>" not in out.text
    kept = im_end_llm.generate(
        [PROMPTS[0]],
        SamplingParams(max_tokens=MAX, skip_special_tokens=False, include_stop_str_in_output=True),
    )[0]
    assert kept.text.endswith("<|im_end|>")

"""A generation cut inside a multi-byte character ends without U+FFFD; a real U+FFFD is kept."""

from __future__ import annotations

import pytest

from prefixflow.engine.core.request import Request
from prefixflow.engine.sampling.sampling_params import SamplingParams
from prefixflow.engine.sampling.stop_checker import StopChecker
from prefixflow.engine.sampling.utf8_tail import trim_incomplete_utf8


@pytest.fixture(scope="module")
def tokenizer():
    from prefixflow.engine.loading.loader import resolve_model

    return resolve_model("tiny").tokenizer  # byte-level BPE, like SmolLM2's and Llama 3's


def _finished(tokenizer, output: list[int], **params) -> str:
    prompt = tokenizer.encode("Say it:", add_special_tokens=False)
    req = Request(0, "0", prompt, SamplingParams(**params), max_tokens=len(output), seed=0)
    req.token_ids.extend(output)
    checker = StopChecker(tokenizer, (tokenizer.eos_token_id,), 1000)
    return checker.final_text(req, None)


def test_max_tokens_inside_an_emoji_drops_the_broken_character(tokenizer) -> None:
    ids = tokenizer.encode(" angry 😡😡", add_special_tokens=False)
    assert tokenizer.decode(ids[:-1]).endswith("\ufffd")  # what users saw: '😡😡' cut to '😡�'
    assert _finished(tokenizer, ids[:-1]) == " angry 😡"
    assert _finished(tokenizer, ids) == " angry 😡😡"


def test_a_broken_character_before_eos_is_dropped_too(tokenizer) -> None:
    ids = tokenizer.encode(" hi 😡", add_special_tokens=False)[:-1] + [tokenizer.eos_token_id]
    assert _finished(tokenizer, ids) == " hi "


def test_a_generated_replacement_character_is_kept(tokenizer) -> None:
    ids = tokenizer.encode(" bad byte \ufffd", add_special_tokens=False)
    assert _finished(tokenizer, ids) == " bad byte \ufffd"


def test_ids_beyond_the_tokenizer_decode_to_nothing(tokenizer) -> None:
    """A model whose vocabulary is padded past the tokenizer's can sample such an id (a random-weight
    1B preset did, at batch 64): the row must finish, not fail with "detokenizing failed"."""
    unknown = len(tokenizer) + 7
    assert tokenizer.convert_ids_to_tokens([unknown]) == [None]
    ids = tokenizer.encode(" angry 😡😡", add_special_tokens=False)
    assert _finished(tokenizer, ids[:-1] + [unknown]) == " angry 😡"
    assert _finished(tokenizer, ids + [unknown]) == " angry 😡😡"


def test_tokenizers_without_a_byte_view_are_left_alone() -> None:
    class Plain:
        def convert_ids_to_tokens(self, ids):  # pragma: no cover - never reached
            raise AssertionError

    assert trim_incomplete_utf8("x\ufffd", Plain(), [1, 2]) == "x\ufffd"

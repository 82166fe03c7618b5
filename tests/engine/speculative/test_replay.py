"""The pilot's speculation replay (engine/speculative/replay.py) proposes what the engine proposes:
on structured outputs at batch 1 with k=4 its drafts, acceptance and grammar-forced share equal what a
real speculative run counted (learned forced splits included)."""

from __future__ import annotations

from prefixflow.engine import LLM, SamplingParams, SpeculationReplay
from tests.engine.speculative.helpers import prompts
from tests.engine.speculative.test_jump_forward import ENGINE, JSON

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def test_replay_equals_the_engine_counts_on_structured_outputs():
    items = prompts(4, seed=71)
    params = SamplingParams(temperature=0.0, max_tokens=32, structured=JSON)
    on = LLM("tiny", speculative_config=NGRAM, **ENGINE)
    off = LLM("tiny", **ENGINE)
    replay = SpeculationReplay(off, k=4, lookup_min=2, lookup_max=5)
    for item in items:  # one at a time: the order in which the engine learns forced splits
        (out,) = off.generate([item], params)
        replay.add(out.prompt_token_ids, out.token_ids, JSON)
        (spec,) = on.generate([item], params)
        assert spec.token_ids == out.token_ids
    got = on.stats().speculation
    c = replay.counts
    assert c.forced_proposed == got["jump_forward"]["proposed"] > 0
    assert c.forced_accepted == got["jump_forward"]["accepted"] > 0
    assert c.proposed == sum(v["proposed"] for v in got.values())
    assert c.accepted == sum(v["accepted"] for v in got.values())

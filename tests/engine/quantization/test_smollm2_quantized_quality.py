"""On-the-fly int8 of the embedded SmolLM2 keeps its labels: it agrees with the full-precision engine
(GGUF blocks dequantized to float32) on at least 97 % of the review set (issue 12). Figures for every
method: `python -m benchmarks.quant_eval` (benchmarks/RESULTS.md)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.eval_smollm2 import read_jsonl
from benchmarks.quant_eval import agreement, evaluate

pytestmark = pytest.mark.slow


def test_int8_agrees_with_full_precision_on_97_percent_of_labels():
    torch.set_num_threads(1)
    reviews = read_jsonl("reviews.jsonl")
    dense, int8 = evaluate("none", reviews, "float32"), evaluate("int8", reviews, "float32")
    assert agreement(int8, dense) >= 0.97, [
        (a["id"], a["predicted"], b["predicted"]) for a, b in zip(int8["items"], dense["items"])
    ]
    assert int8["weight_bytes"] < dense["weight_bytes"]

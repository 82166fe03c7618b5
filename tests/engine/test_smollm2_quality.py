"""Labeling quality floor of the embedded SmolLM2-135M-Instruct on the project's review set.

Measured 55/60 = 0.917 (float32, CPU, prompt and scoring of ``benchmarks/eval_smollm2.py``); the
floor sits about ten points lower, so only a real regression (wrong weights, broken scoring, tokenizer
or template) fails it, not a flip of one borderline review.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.eval_smollm2 import LABELS, label_reviews, read_jsonl

ACCURACY_FLOOR = 0.80


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_review_labeling_accuracy_stays_above_the_floor(one_thread):
    from prefixflow.engine import LLM

    reviews = read_jsonl("reviews.jsonl")
    assert len(reviews) == 60
    assert sum(r["label"] == "positive" for r in reviews) == 30 and {r["label"] for r in reviews} == set(
        LABELS
    )
    llm = LLM(model="smollm2-135m-instruct", dtype="float32")
    result = label_reviews(llm, reviews)
    predicted = [item["predicted"] for item in result["items"]]
    assert len(set(predicted)) == 2, "the model answers one label for everything"
    assert result["accuracy"] >= ACCURACY_FLOOR, [i for i in result["items"] if i["label"] != i["predicted"]]

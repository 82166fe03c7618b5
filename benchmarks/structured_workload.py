"""Extraction workload on the project's review and news texts: three JSON schemas (enum field, array of
strings, nested objects, integers with bounds) and the chat prompts that ask SmolLM2 for them.

Strings and arrays are bounded (maxLength, maxItems), so a constrained answer always fits in
``MAX_TOKENS``; shared by ``benchmarks/structured_bench.py`` and the slow SmolLM2 extraction test.
"""

from __future__ import annotations

from benchmarks.eval_smollm2 import read_jsonl

MAX_TOKENS = 320
SHORT = {"type": "string", "minLength": 1, "maxLength": 40}

SCHEMAS: dict[str, dict] = {
    # enum field + array of strings
    "review": {
        "type": "object",
        "properties": {
            "sentiment": {"type": "string", "enum": ["positive", "negative", "mixed"]},
            "product": SHORT,
            "issues": {"type": "array", "items": SHORT, "maxItems": 3},
        },
        "required": ["sentiment", "product", "issues"],
        "additionalProperties": False,
    },
    # nested objects + integer with bounds + boolean + enum
    "rating": {
        "type": "object",
        "properties": {
            "rating": {
                "type": "object",
                "properties": {
                    "stars": {"type": "integer", "minimum": 1, "maximum": 5},
                    "recommend": {"type": "boolean"},
                },
                "required": ["stars", "recommend"],
                "additionalProperties": False,
            },
            "product": {
                "type": "object",
                "properties": {
                    "name": SHORT,
                    "category": {"enum": ["electronics", "kitchen", "clothing", "home", "sports", "other"]},
                },
                "required": ["name", "category"],
                "additionalProperties": False,
            },
        },
        "required": ["rating", "product"],
        "additionalProperties": False,
    },
    # news: enum, array of strings, bounded integer, a longer string
    "news": {
        "type": "object",
        "properties": {
            "topic": {"enum": ["politics", "sports", "science", "business", "culture", "local", "other"]},
            "people_or_groups": {"type": "array", "items": SHORT, "maxItems": 3},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "headline": {"type": "string", "minLength": 1, "maxLength": 100},
        },
        "required": ["topic", "people_or_groups", "year", "headline"],
        "additionalProperties": False,
    },
}

QUESTIONS = {
    "review": "Extract from this product review: the sentiment, the product, and up to three issues "
    "(an empty list if there are none). Answer in JSON.\n\nReview: {text}",
    "rating": "From this product review, give the star rating (1 to 5), whether the reviewer would "
    "recommend it, and the product's name and category. Answer in JSON.\n\nReview: {text}",
    "news": "From this news paragraph, give the topic, up to three people or groups named, the year it "
    "is about (a guess if not stated) and a short headline. Answer in JSON.\n\nNews: {text}",
}


def extraction_rows(per_review_schema: int = 40) -> list[tuple[str, str]]:
    """``(schema name, text)`` pairs: ``per_review_schema`` reviews for each review schema, every news
    paragraph for the news schema (40 + 40 + 20 = 100 by default)."""
    reviews = read_jsonl("reviews.jsonl")
    news = read_jsonl("news.jsonl")
    rows = [("review", reviews[i % len(reviews)]["text"]) for i in range(per_review_schema)]
    rows += [("rating", reviews[-1 - i % len(reviews)]["text"]) for i in range(per_review_schema)]
    rows += [("news", n["text"]) for n in news]
    return rows


def extraction_prompts(llm, rows: list[tuple[str, str]]) -> list[str]:
    return [
        llm.apply_chat_template([{"role": "user", "content": QUESTIONS[name].format(text=text)}])
        for name, text in rows
    ]

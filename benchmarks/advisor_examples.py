"""The input docs/advisor.md walks through: a synthetic labeling job of 10 M rows with a ~1,000-token
instruction. Each review is an opening and a body drawn from two pools of 3,000 (9 M combinations,
so sampled rows rarely repeat), stored as dictionary-encoded columns: 10 M rows take little disk.

Run: PYTHONPATH=. python -m benchmarks.advisor_examples --out /tmp/advisor-example
then: prefixflow plan --input /tmp/advisor-example/reviews --job /tmp/advisor-example/label.yaml \
          --model llama-3.1-8b --advise --gpu h100
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

TOPICS = (
    "battery life",
    "screen",
    "delivery",
    "price",
    "build quality",
    "customer support",
    "sound",
    "size",
    "software updates",
    "packaging",
    "warranty",
    "comfort",
)
WORDS = (
    "the arrived late box damaged works great after week stopped charging support replaced quickly "
    "cheap plastic feels solid bright screen colours accurate battery lasts two days would buy again "
    "not recommend price fair refund took month sound clear bass weak"
).split()


def instruction(sentences: int = 13) -> str:
    """A labeling guide: one rule per topic, repeated in detail, as a real taxonomy prompt would be."""
    lines = ["You label customer reviews with exactly one topic from the list below.", ""]
    for i in range(sentences):
        topic = TOPICS[i % len(TOPICS)]
        lines.append(
            f"Rule {i + 1}: a review that mainly discusses {topic} gets the label '{topic}', even when "
            f"it also mentions other topics in passing; judge by what most sentences are about."
        )
    lines += ["", "Answer with the label only."]
    return "\n".join(lines)


def _pool(rng: random.Random, n: int, lo: int, hi: int) -> pa.Array:
    return pa.array([" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(n)])


def write(out: Path, rows: int = 10_000_000, files: int = 20, distinct: int = 3000, seed: int = 0) -> None:
    rng = random.Random(seed)
    openings, bodies = _pool(rng, distinct, 4, 12), _pool(rng, distinct, 20, 110)
    (out / "reviews").mkdir(parents=True, exist_ok=True)
    per = rows // files
    for f in range(files):
        columns = {"id": pa.array(range(f * per, (f + 1) * per), pa.int64())}
        for name, pool in (("opening", openings), ("body", bodies)):
            idx = pa.array([rng.randrange(distinct) for _ in range(per)], pa.int32())
            columns[name] = pa.DictionaryArray.from_arrays(idx, pool)
        pq.write_table(pa.table(columns), out / "reviews" / f"part-{f:02d}.parquet", row_group_size=250_000)
    job = (
        "task: label\nid_column: id\nchat: off\ntemplate: |\n"
        + "".join(f"  {line}\n" for line in instruction().splitlines())
        + "\n  Review: {{ opening }} {{ body }}\n  Topic:\n"
        + f"label:\n  labels: [{', '.join(repr(t) for t in TOPICS)}]\n  mode: score\n  choice_prefix: ' '\n"
        + "output: {shard_rows: 100000}\n"
    )
    (out / "label.yaml").write_text(job)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="advisor-example")
    ap.add_argument("--rows", type=int, default=10_000_000)
    args = ap.parse_args()
    write(Path(args.out), args.rows)
    print(f"wrote {args.rows:,} rows to {args.out}/reviews and the job to {args.out}/label.yaml")


if __name__ == "__main__":
    main()

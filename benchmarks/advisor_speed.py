"""How long `prefixflow plan --advise` takes on N sampled rows (the issue-18 goal: under 10 s for 5,000 rows
on the CPU, torch-free). Builds a synthetic review dataset and the demo's labeling job (with shards of
10,000 rows), then times the whole command in a subprocess where `import torch` fails, so the measured
path is the torch-free one; the advisor's own phases come from its --json timings in a second run.

Run: PYTHONPATH=. python -m benchmarks.advisor_speed --rows 50000 --sample-rows 5000 --repeats 3 \
         --json benchmarks/results/cpu_advisor_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

REPO = Path(__file__).resolve().parents[1]
WORDS = (
    "kettle boils quickly handle stays cool battery lasts charger broke after weeks support refused "
    "refund sound quality great bass weak screen bright colours accurate shipping late box damaged "
    "would buy again not recommend price fair cheap plastic feels solid sturdy design elegant"
).split()
RUN = "import sys; sys.modules['torch'] = None; from prefixflow.pipeline.cli import main; sys.exit(main(sys.argv[1:]))"


def write_reviews(folder: Path, rows: int, files: int = 8, seed: int = 0) -> None:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    per = rows // files
    for f in range(files):
        texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 250))) for _ in range(per)]
        table = pa.table({"id": [f"r{f}-{i}" for i in range(per)], "text": texts})
        pq.write_table(table, folder / f"part-{f:02d}.parquet", row_group_size=5000)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--sample-rows", type=int, default=5000)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument(
        "--job",
        default=str(REPO / "pipeline" / "data" / "demo_label.yaml"),
        help="job config (its output.shard_rows is set to 10000)",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "reviews"
        write_reviews(data, args.rows)
        job = yaml.safe_load(Path(args.job).read_text())
        job["output"] = {**job.get("output", {}), "shard_rows": 10_000}
        job_file = Path(tmp) / "job.yaml"
        job_file.write_text(yaml.safe_dump(job))
        cmd = [
            sys.executable,
            "-c",
            RUN,
            "plan",
            "--input",
            str(data),
            "--job",
            str(job_file),
            "--model",
            args.model,
            "--advise",
            "--sample-rows",
            str(args.sample_rows),
            "--gpu",
            "h200",
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        walls, inner = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            walls.append(time.perf_counter() - start)
            done = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env, check=True)
            inner.append(json.loads(done.stdout)["advise"]["timings_s"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    result = {
        "commit": commit.stdout.strip(),
        "rows": args.rows,
        "sample_rows": args.sample_rows,
        "model": args.model,
        "job": Path(args.job).name,
        "wall_s": walls,
        "wall_min_s": min(walls),
        "wall_median_s": sorted(walls)[len(walls) // 2],
        "advise_timings_s": inner,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()

"""The walk of one job parameter through `prefixflow run` (issue 23, "Done when").

Runs `local_run.run_local` for one small job (tiny model, 2 one-row-group files, 4 shards) under
`sys.setprofile` and records every call into prefixflow's pipeline (and flows) code:

- ``spec walk``: the calls that receive the job's ``JobSpec`` itself as an argument (``self`` of its own
  methods does not count), in order; the module
  of each, with repeats collapsed. ``returns`` counts entering a module the walk had already left (the
  spec passed back and forth between modules), ``modules`` the distinct modules it visits.
- ``spec or run walk``: the same, counting also calls that receive an object carrying that spec (a
  ``Run``), so the figure cannot shrink just because the spec travels inside another object.
- ``all calls``: every call into pipeline code, whatever its arguments.

Each walk also counts the same at the folder level (``pipeline/run``, ``pipeline/tasks``, a module at the
root such as ``pipeline/local_run.py``): how often the walk goes back into a folder (a layer) it had left.

    python -m benchmarks.module_walk [--json out.json] [--load-engine]

``--load-engine``: `run_local` loads the engine itself (as `prefixflow run` does) instead of being handed one.

Run from a checkout's root (it imports that checkout's prefixflow).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

JOB = {
    "task": "generate",
    "id_column": "id",
    "template": "Say {{ text }}",
    "sampling": {"max_tokens": 1},
    "engine": {"max_model_len": 160, "max_num_seqs": 32},
    "output": {"shard_rows": 1},
}
PACKAGES = ("prefixflow/pipeline/", "prefixflow/flows/", "/pipeline/", "/flows/")


class Walk:
    """Module sequence of the calls that satisfy ``wanted``, with repeats collapsed."""

    def __init__(self) -> None:
        self.sequence: list[str] = []
        self.calls = 0

    def enter(self, module: str) -> None:
        self.calls += 1
        if not self.sequence or self.sequence[-1] != module:
            self.sequence.append(module)

    def summary(self) -> dict[str, Any]:
        seen, returns = _returns(self.sequence)
        folders = [_folder(m) for m in self.sequence]
        folder_seq = [f for i, f in enumerate(folders) if not i or folders[i - 1] != f]
        seen_folders, folder_returns = _returns(folder_seq)
        return {
            "calls": self.calls,
            "modules": len(seen),
            "returns": sum(returns.values()),
            "returns_by_module": dict(returns.most_common()),
            "visited": sorted(seen),
            "folders": len(seen_folders),
            "folder_returns": sum(folder_returns.values()),
            "folder_returns_by_folder": dict(folder_returns.most_common()),
        }


def _returns(sequence: list[str]) -> tuple[set[str], Counter[str]]:
    """The distinct entries of ``sequence`` and, per entry, how often it is entered again after being left."""
    seen: set[str] = set()
    returns: Counter[str] = Counter()
    for i, m in enumerate(sequence):
        if m in seen and sequence[i - 1] != m:
            returns[m] += 1
        seen.add(m)
    return seen, returns


def _folder(module: str) -> str:
    """``pipeline/run/record.py`` -> ``pipeline/run``; a module at a layer's root is its own (``pipeline/cli.py``)."""
    parts = module.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else module


def _module(frame: FrameType) -> str | None:
    path = frame.f_code.co_filename.replace("\\", "/")
    if "prefixflow" not in path and "/work/" not in path:
        return None
    for marker in ("/pipeline/", "/flows/"):
        if marker in path:
            return marker.strip("/") + "/" + path.split(marker, 1)[1]
    return None


def trace(spec: Any, llm: Any) -> dict[str, Any]:
    try:
        from prefixflow.pipeline.local_run import run_local
    except ImportError:  # a checkout from before the pipeline's layers contract (the driver was in run/)
        from prefixflow.pipeline.run.local_run import run_local  # type: ignore[import-not-found,no-redef]

    walks = {"spec walk": Walk(), "spec or run walk": Walk(), "all calls": Walk()}

    def carries(value: Any) -> bool:
        return value is spec or getattr(value, "spec", None) is spec

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = _module(frame)
        if module is None or frame.f_code.co_name.startswith("<"):
            return
        walks["all calls"].enter(module)
        code = frame.f_code
        names = [
            n
            for n in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            if n not in ("self", "cls")
        ]
        values = [frame.f_locals.get(n) for n in names]
        if any(v is spec for v in values):
            walks["spec walk"].enter(module)
        if any(carries(v) for v in values):
            walks["spec or run walk"].enter(module)

    sys.setprofile(profile)
    try:
        summary, failures = run_local(spec, llm=llm, progress=False)
    finally:
        sys.setprofile(None)
    assert not failures and summary.complete, (summary, failures)
    return {name: w.summary() for name, w in walks.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--load-engine", action="store_true", help="run_local loads the engine (as the CLI does)")
    args = ap.parse_args()
    from prefixflow.engine import LLM
    from prefixflow.pipeline import load_job

    with tempfile.TemporaryDirectory() as tmp:
        for f in range(2):
            rows = {"id": [f"r{f}-{i}" for i in range(2)], "text": [f"item {f} {i}" for i in range(2)]}
            Path(tmp, "in").mkdir(exist_ok=True)
            pq.write_table(pa.table(rows), f"{tmp}/in/part-{f}.parquet", row_group_size=1)
        spec = load_job(f"{tmp}/in", f"{tmp}/out", "tiny", JOB)
        llm = None if args.load_engine else LLM(model="tiny", **JOB["engine"])  # type: ignore[arg-type]
        result = trace(spec, llm)
    for name, r in result.items():
        top = ", ".join(f"{m} {n}" for m, n in list(r["returns_by_module"].items())[:6])
        print(
            f"{name}: {r['calls']} calls, {r['modules']} modules, {r['returns']} returns to a module left ({top}); "
            f"{r['folders']} folders, {r['folder_returns']} returns to a folder left"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

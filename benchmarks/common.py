"""Shared helpers for the benchmarks: one model built once, handed to every engine; timing; output.

Run benchmarks from the repository root as modules, e.g. ``python -m benchmarks.engine_vs_hf``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from prefixflow.engine.dtypes import torch_dtype
from prefixflow.engine.loading.model_identity import resolve_dtype


def add_common_args(ap, preset: str = "tiny") -> None:
    """Arguments every benchmark takes: model, placement, seed, CPU threads, JSON output."""
    ap.add_argument("--preset", default=preset, help="model preset under configs/models (random weights)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument(
        "--dtype", default="auto", help="auto (bf16 on CUDA, float32 on CPU) | float32 | bfloat16"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default on CPU: 1, because the benchmark host is shared and "
        "oversubscribed OpenMP threads distort timings; pass the core count on an idle machine)",
    )
    ap.add_argument("--json", default=None, help="write the result here")


def setup_threads(threads: int | None, device: str = "auto") -> None:
    """Fix the torch CPU thread count (1 by default on CPU runs, untouched on CUDA)."""
    if threads is None and pick_device(device).type == "cpu":
        threads = 1
    if threads:
        torch.set_num_threads(threads)


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """The engine's own rule for ``auto`` (``resolve_dtype``; no model file here, so float32 on the CPU)."""
    return torch_dtype(resolve_dtype(name, device.type))


@dataclass
class BenchModel:
    """A transformers model plus what the engine needs to run the same weights."""

    preset: str
    model: torch.nn.Module
    tokenizer: object
    hf_config: dict
    device: torch.device
    dtype: torch.dtype

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config["vocab_size"])

    @property
    def max_position_embeddings(self) -> int:
        return int(self.hf_config.get("max_position_embeddings", 2048))

    @property
    def pad_token_id(self) -> int:
        return 0


def build_model(preset: str, device: str = "auto", dtype: str = "auto", seed: int = 0) -> BenchModel:
    """Random-init the preset's transformers model directly on the device (fixed seed), in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from prefixflow.engine.loading.presets import hf_config_of, load_preset
    from prefixflow.engine.loading.tokenizer_train import train_tokenizer

    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    cfg = dict(hf_config_of(load_preset(preset)))
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    config.eos_token_id = None  # benchmarks ignore EOS on every side
    config.bos_token_id = None
    torch.manual_seed(seed)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=dt, attn_implementation="sdpa")
    model.eval()
    hf_config = model.config.to_dict()
    hf_config["architectures"] = list(cfg.get("architectures") or [type(model).__name__])
    tokenizer = train_tokenizer(config.vocab_size)
    return BenchModel(preset, model, tokenizer, hf_config, dev, dt)


def model_source(bm: BenchModel):
    """An engine ``ModelSource`` over the transformers model's own tensors (same weights, same process)."""
    from prefixflow.engine import ModelSource

    def weights() -> Iterator[tuple[str, torch.Tensor]]:
        yield from bm.model.state_dict().items()

    return ModelSource(
        name=f"bench-{bm.preset}",
        hf_config=bm.hf_config,
        weights=weights,
        tokenizer=bm.tokenizer,
        eos_token_ids=(),
        identity={"preset": bm.preset, "format": "in-memory"},
    )


def engine_options(bm: BenchModel, **overrides) -> dict:
    """EngineConfig keywords matching the benchmark model's device and dtype."""
    dtype_name = str(bm.dtype).removeprefix("torch.")
    return {"device": bm.device.type, "dtype": dtype_name, **overrides}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """``with Timer(device) as t: ...`` then ``t.seconds`` (synchronises CUDA on both ends)."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> Timer:
        if self.device is not None:
            synchronize(self.device)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.device is not None:
            synchronize(self.device)
        self.seconds = time.perf_counter() - self.start


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float | None]:
    """Nearest-rank percentiles, ``{"p50": ..., ...}``; None when there are no values."""
    if not values:
        return {f"p{q}": None for q in qs}
    ordered = sorted(values)
    out = {}
    for q in qs:
        rank = max(1, -(-q * len(ordered) // 100))  # ceil(q/100 * n)
        out[f"p{q}"] = ordered[rank - 1]
    return out


def mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def environment() -> dict:
    """Versions and hardware, stored with every result."""
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m": os.getloadavg()[0],
        "gpu": None,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    info.update(git_state())
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def git_state() -> dict:
    """The commit benchmarked and whether engine/ or kernels/ had uncommitted changes (None outside git)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    dirty = git("status", "--porcelain", "--", "engine", "kernels")
    return {
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "engine_dirty": bool(dirty) if dirty is not None else None,
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_json(path: str | Path | None, result: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2, default=str) + "\n")


def fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value == 0 or 0.01 <= abs(value) < 1e5:
            return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


def print_table(rows: Sequence[dict], columns: Sequence[str], title: str | None = None) -> str:
    """Print (and return) a plain aligned table of ``rows`` restricted to ``columns``."""
    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [
        max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)
    ]
    lines = [title] if title else []
    lines.append("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def random_tokens(rng, n: int, vocab_size: int, low: int = 1) -> list[int]:
    """``n`` token ids uniform in [low, vocab_size) from a ``random.Random``; 0 stays free for padding."""
    return [rng.randrange(low, vocab_size) for _ in range(n)]

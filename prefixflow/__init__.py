"""prefixflow: offline batch inference for LLMs, Parquet in and out, a prefix-sorted paged-KV engine between.

The four layers are installed as subpackages: ``prefixflow.engine``, ``prefixflow.kernels``,
``prefixflow.pipeline`` and ``prefixflow.flows`` (flows → pipeline → engine → kernels). The names below
are imported lazily, so ``import prefixflow`` (and the torch-free CLI commands) never load torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# In a source checkout the layers are top-level folders, and prefixflow/engine etc. are symbolic links to
# them (so PYTHONPATH=. and import-linter see one package); the wheel maps them with package-dir.

_EXPORTS = {
    "LLM": "prefixflow.engine",
    "SamplingParams": "prefixflow.engine",
    "EngineConfig": "prefixflow.engine",
    "RequestOutput": "prefixflow.engine",
    "describe_model": "prefixflow.engine",
    "StructuredOutputs": "prefixflow.engine",
    "batch_inference": "prefixflow.flows",
    "load_job": "prefixflow.pipeline",
    "plan_shards": "prefixflow.pipeline",
    "run_shard": "prefixflow.pipeline",
}

__all__ = [
    "LLM",
    "EngineConfig",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputs",
    "__version__",
    "batch_inference",
    "describe_model",
    "load_job",
    "plan_shards",
    "run_shard",
]

if TYPE_CHECKING:
    from prefixflow.engine import (
        LLM,
        EngineConfig,
        RequestOutput,
        SamplingParams,
        StructuredOutputs,
        describe_model,
    )
    from prefixflow.flows import batch_inference
    from prefixflow.pipeline import load_job, plan_shards, run_shard


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'prefixflow' has no attribute {name!r}")

"""Prefect orchestration for prefixflow: the `batch_inference` flow, engine lanes, serving.

Names are imported lazily so that `flows.dealing` and friends load without the pipeline.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

if __name__ != "prefixflow.flows":  # every file has one import path (docs/architecture.md, Packaging)
    raise ImportError(f"import prefixflow.flows, not {__name__}: flows/ is the prefixflow.flows package")

_EXPORTS = {
    "batch_inference": "prefixflow.flows.flow",
    "ShardsFailed": "prefixflow.flows.flow",
    "deal_shards": "prefixflow.flows.dealing",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'flows' has no attribute {name!r}")

"""The only door from the pipeline into the engine: its public facade, imported lazily.

Lazy so that planning, status and config validation work without importing torch.
"""

from __future__ import annotations

from typing import Any

FACADE = ("LLM", "SamplingParams", "RequestOutput", "EngineConfig", "describe_model")


def __getattr__(name: str) -> Any:
    if name in FACADE:
        from prefixflow import engine
        return getattr(engine, name)
    raise AttributeError(name)

"""The only door from the pipeline into the engine: its public facade, imported lazily.

Lazy so that planning, status and the I/O paths work (and fail fast on config) without loading torch.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("LLM", "SamplingParams", "RequestOutput", "EngineConfig"):
        import engine

        try:
            return getattr(engine, name)
        except AttributeError:  # TODO(pipeline): drop once engine/__init__.py exports the facade
            if name == "EngineConfig":
                from engine.config import EngineConfig

                return EngineConfig
            if name == "SamplingParams":
                from engine.sampling_params import SamplingParams

                return SamplingParams
            raise
    raise AttributeError(name)

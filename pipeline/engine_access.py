"""The only door from the pipeline into the engine: its public facade, imported lazily, and open_engine.

Lazy so that planning, status, config validation and the advisor (``inspect_model``: config and
tokenizer without weights) work without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefixflow.pipeline.spec import JobSpec

FACADE = ("LLM", "SamplingParams", "RequestOutput", "EngineConfig", "describe_model", "inspect_model")


def __getattr__(name: str) -> Any:
    if name in FACADE:
        from prefixflow import engine

        return getattr(engine, name)
    raise AttributeError(name)


def open_engine(spec: JobSpec) -> Any:
    """Load ``spec.model`` with the job's engine settings; a lane loads it once and reuses it for many shards."""
    from prefixflow.engine import LLM

    return LLM(model=spec.model, **spec.config.engine)

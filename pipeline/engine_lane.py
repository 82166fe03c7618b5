"""open_engine: one engine per lane, loaded once and reused for many shards."""

from __future__ import annotations

from typing import Any

from prefixflow.pipeline.spec import JobSpec


def open_engine(spec: JobSpec) -> Any:
    """Load ``spec.model`` with the job's engine settings (through the engine's public facade)."""
    from prefixflow.pipeline.facade import LLM

    return LLM(model=spec.model, **spec.config.engine)

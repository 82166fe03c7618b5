"""prefixflow's inference engine: paged KV cache, continuous batching, prefix caching.

The public names are imported lazily (PEP 562), so ``import prefixflow.engine.<module>`` for a
torch-free module (sampling parameters, the engine config, ``inspect_model``) does not load torch:
``prefixflow plan --advise`` and config validation run where torch is missing.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if __name__ != "prefixflow.engine":  # every file has one import path (docs/architecture.md, Packaging)
    raise ImportError(f"import prefixflow.engine, not {__name__}: engine/ is the prefixflow.engine package")

_EXPORTS = {
    "LLM": "prefixflow.engine.llm",
    "Logprob": "prefixflow.engine.outputs",
    "EngineConfig": "prefixflow.engine.config",
    "EngineStats": "prefixflow.engine.core.stats",
    "ModelCard": "prefixflow.engine.loading.model_card",
    "ModelSource": "prefixflow.engine.loading.model_source",
    "RequestOutput": "prefixflow.engine.outputs",
    "SamplingParams": "prefixflow.engine.sampling.sampling_params",
    "StructuredOutputs": "prefixflow.engine.structured",
    "TokenLogprob": "prefixflow.engine.outputs",
    "NgramIndex": "prefixflow.engine.speculative.ngram",
    "SpeculationReplay": "prefixflow.engine.speculative.replay",
    "describe_model": "prefixflow.engine.loading.model_identity",
    "inspect_model": "prefixflow.engine.loading.model_card",
    "structured_outputs_error": "prefixflow.engine.structured",
    "set_cpu_threads": "prefixflow.engine.cpu_threads",
    "ThreadPlan": "prefixflow.engine.cpu_threads",
}

__all__ = [
    "LLM",
    "Logprob",
    "EngineConfig",
    "EngineStats",
    "ModelCard",
    "ModelSource",
    "describe_model",
    "inspect_model",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputs",
    "TokenLogprob",
    "NgramIndex",
    "SpeculationReplay",
    "structured_outputs_error",
    "set_cpu_threads",
    "ThreadPlan",
]

if TYPE_CHECKING:
    from prefixflow.engine.config import EngineConfig
    from prefixflow.engine.core.stats import EngineStats
    from prefixflow.engine.cpu_threads import ThreadPlan, set_cpu_threads
    from prefixflow.engine.llm import LLM
    from prefixflow.engine.loading.model_card import ModelCard, inspect_model
    from prefixflow.engine.loading.model_identity import describe_model
    from prefixflow.engine.loading.model_source import ModelSource
    from prefixflow.engine.outputs import Logprob, RequestOutput, TokenLogprob
    from prefixflow.engine.sampling.sampling_params import SamplingParams
    from prefixflow.engine.speculative.ngram import NgramIndex
    from prefixflow.engine.speculative.replay import SpeculationReplay
    from prefixflow.engine.structured import StructuredOutputs, structured_outputs_error


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'prefixflow.engine' has no attribute {name!r}")

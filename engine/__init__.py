"""prefixflow's inference engine: paged KV cache, continuous batching, prefix caching."""

from prefixflow.engine.config import EngineConfig
from prefixflow.engine.llm import LLM
from prefixflow.engine.model_identity import describe_model
from prefixflow.engine.model_source import ModelSource
from prefixflow.engine.outputs import RequestOutput, TokenLogprob
from prefixflow.engine.sampling_params import SamplingParams
from prefixflow.engine.stats import EngineStats
from prefixflow.engine.structured import StructuredOutputs, structured_outputs_error

__all__ = [
    "LLM",
    "EngineConfig",
    "EngineStats",
    "ModelSource",
    "describe_model",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputs",
    "TokenLogprob",
    "structured_outputs_error",
]

"""prefixflow's inference engine: paged KV cache, continuous batching, prefix caching."""

from engine.config import EngineConfig
from engine.llm import LLM
from engine.model_identity import describe_model
from engine.model_source import ModelSource
from engine.outputs import RequestOutput, TokenLogprob
from engine.sampling_params import SamplingParams
from engine.stats import EngineStats

__all__ = [
    "LLM",
    "EngineConfig",
    "EngineStats",
    "ModelSource",
    "describe_model",
    "RequestOutput",
    "SamplingParams",
    "TokenLogprob",
]

"""The only door from the pipeline into the engine: its public facade (imported lazily), the ``Engine``
protocol the pipeline codes against (``open_engine``, which loads a job's model, is in job/spec.py: it
asks the job's task for engine defaults, and this module sits below the job and the tasks).

Lazy so that planning, status, config validation and the advisor (``inspect_model``: config and
tokenizer without weights) work without importing torch. The protocols name exactly what the pipeline
uses, so a test double or another engine only has to provide that.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prefixflow.engine import (
        EngineConfig,
        NgramIndex,
        SamplingParams,
        SpeculationReplay,
        StructuredOutputs,
        describe_model,
        inspect_model,
        set_cpu_threads,
        structured_outputs_error,
    )

__all__ = [
    "Engine",
    "EngineConfig",
    "NgramIndex",
    "Output",
    "SamplingParams",
    "SpeculationReplay",
    "StructuredOutputs",
    "Tokenizer",
    "describe_model",
    "inspect_model",
    "set_cpu_threads",
    "structured_outputs_error",
]

Choice = str | Sequence[int]  # a label choice to score: its text, or exact token ids

FACADE = (
    "LLM",
    "SamplingParams",
    "RequestOutput",
    "EngineConfig",
    "describe_model",
    "StructuredOutputs",
    "structured_outputs_error",
    "inspect_model",
    "NgramIndex",
    "SpeculationReplay",
    "set_cpu_threads",
)


def __getattr__(name: str) -> Any:
    if name in FACADE:
        from prefixflow import engine

        return getattr(engine, name)
    raise AttributeError(name)


class Tokenizer(Protocol):
    """The tokenizer calls the pipeline makes (a transformers tokenizer provides them)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


class Output(Protocol):
    """One finished request as the pipeline reads it (``prefixflow.engine.RequestOutput``)."""

    @property
    def request_id(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def finish_reason(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_cached_tokens(self) -> int: ...
    @property
    def num_output_tokens(self) -> int: ...
    @property
    def latency(self) -> float: ...
    @property
    def samples(self) -> Sequence[Any]: ...  # n > 1: each sample's text, token_ids, finish_reason


class Engine(Protocol):
    """The engine as the pipeline uses it; ``prefixflow.engine.LLM`` is the implementation.

    Prompts always go in as token ids the pipeline counted itself (see rows.py)."""

    @property
    def tokenizer(self) -> Any: ...  # a Tokenizer; Any because the engine types it as a plain object
    @property
    def max_model_len(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...  # the model's: sampling values are checked against it per row

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str: ...

    def generate(
        self, prompts: Sequence[list[int]], params: Sequence[SamplingParams]
    ) -> Sequence[Output]: ...

    def generate_stream(
        self, prompts: Sequence[list[int]], params: Sequence[SamplingParams], request_ids: Sequence[str]
    ) -> Iterator[Output]: ...

    def score_choices(
        self,
        prompts: Sequence[list[int]],
        choices: Sequence[Sequence[Choice]],
        usage: list[Any] | None = None,
    ) -> list[list[float] | str]: ...

    def score_choices_stream(
        self, prompts: Sequence[list[int]], choices: Sequence[Sequence[Choice]]
    ) -> Iterator[tuple[int, list[float] | str, dict[str, Any]]]: ...

"""A model as the engine consumes it, whatever it was stored as (HF directory, GGUF file, random preset)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from prefixflow.engine.loading.model_identity import ModelLocation


@dataclass(frozen=True)
class ModelSource:
    """Everything needed to build a model, independent of the on-disk format.

    ``hf_config`` is a dict shaped like a Hugging Face ``config.json`` (``architectures``,
    ``hidden_size``, ``num_attention_heads``, ...). ``weights`` yields ``(hf_name, tensor)`` pairs with
    Hugging Face parameter names (``model.layers.0.self_attn.q_proj.weight``), already in the layout
    transformers uses (so GGUF's rotary row permutation is undone before this point).

    ``location`` is where the loader found it (its identity is ``model_identity.identity_of`` of it,
    exactly what ``describe_model`` reports); an in-memory source has none and names itself in
    ``identity`` instead.
    """

    name: str
    hf_config: dict[str, Any]
    weights: Callable[[], Iterator[tuple[str, torch.Tensor]]]
    tokenizer: Any  # a transformers PreTrainedTokenizerBase
    eos_token_ids: tuple[int, ...] = ()
    chat_template: str | None = None
    location: ModelLocation | None = None
    identity: dict[str, Any] = field(default_factory=dict)

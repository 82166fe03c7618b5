"""A model as the engine consumes it, whatever it was stored as (HF directory, GGUF file, random preset)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class ModelSource:
    """Everything needed to build a model, independent of the on-disk format.

    ``hf_config`` is a dict shaped like a Hugging Face ``config.json`` (``architectures``,
    ``hidden_size``, ``num_attention_heads``, ...). ``weights`` yields ``(hf_name, tensor)`` pairs with
    Hugging Face parameter names (``model.layers.0.self_attn.q_proj.weight``), already in the layout
    transformers uses (so GGUF's rotary row permutation is undone before this point).
    """

    name: str
    hf_config: dict
    weights: Callable[[], Iterator[tuple[str, torch.Tensor]]]
    tokenizer: object  # transformers.PreTrainedTokenizerBase
    eos_token_ids: tuple[int, ...] = ()
    chat_template: str | None = None
    identity: dict = field(default_factory=dict)  # what makes this model this model (path, size, hash)

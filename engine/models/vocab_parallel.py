"""Vocabulary-parallel embedding and the logits gather.

Each rank holds the embedding rows of its slice of the vocabulary. A token outside the slice looks up
row 0 and is zeroed, so after the all-reduce every rank has every token's embedding. The LM head (or
the tied embedding) gives each rank the logits of its slice; rank 0 gathers the slices, drops the
padding that made them equal in size, and alone samples.
"""

from __future__ import annotations

import torch
from torch import nn

from prefixflow.engine.distributed.group import ParallelGroup
from prefixflow.engine.distributed.sharding import VocabShard


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab: VocabShard, hidden_size: int, group: ParallelGroup, dtype: torch.dtype) -> None:
        super().__init__()
        self.vocab, self.group = vocab, group
        self.weight = nn.Parameter(
            torch.empty(vocab.owned.size, hidden_size, dtype=dtype), requires_grad=False
        )

    def load(self, tensor: torch.Tensor, name: str = "embed_tokens.weight") -> None:
        owned = self.vocab.owned
        if tensor.shape[0] != owned.total or tensor.shape[1:] != self.weight.shape[1:]:
            raise ValueError(
                f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape "
                f"({owned.total}, {self.weight.shape[1]})"
            )
        self.weight.data.copy_(tensor[owned.as_slice()])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.group.world == 1:
            return nn.functional.embedding(input_ids, self.weight)
        owned = self.vocab.owned
        if owned.size == 0:  # more ranks than tokens: this rank contributes nothing
            zeros = torch.zeros(
                *input_ids.shape, self.weight.shape[1], dtype=self.weight.dtype, device=input_ids.device
            )
            return self.group.all_reduce(zeros)
        inside = (input_ids >= owned.start) & (input_ids < owned.end)
        local = torch.where(inside, input_ids - owned.start, torch.zeros_like(input_ids))
        out = nn.functional.embedding(local, self.weight) * inside.unsqueeze(-1).to(self.weight.dtype)
        return self.group.all_reduce(out)


def gather_logits(local: torch.Tensor, vocab: VocabShard, group: ParallelGroup) -> torch.Tensor | None:
    """Full ``[rows, vocab]`` float32 logits on rank 0 from every rank's ``[rows, owned]`` slice
    (None on the other ranks)."""
    if group.world == 1:
        return local.float()
    pad = vocab.padded_per_rank - local.shape[-1]
    if pad:
        local = nn.functional.pad(local, (0, pad))
    full = group.gather_last_dim(local)
    return None if full is None else full[..., : vocab.owned.total].float()

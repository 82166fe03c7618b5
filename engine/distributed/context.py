"""What a model needs to build its slice: this rank's group and the layout of its shards."""

from __future__ import annotations

from dataclasses import dataclass

from prefixflow.engine.distributed.group import ParallelGroup
from prefixflow.engine.distributed.sharding import TPLayout, tp_layout
from prefixflow.engine.loading.model_config import ModelConfig


@dataclass(frozen=True)
class TensorParallel:
    group: ParallelGroup
    layout: TPLayout

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world(self) -> int:
        return self.group.world


def layout_for(cfg: ModelConfig, rank: int, world: int) -> TPLayout:
    """Rank ``rank``'s layout of ``cfg``; raises ``ShardingError`` naming every dimension that cannot split."""
    return tp_layout(cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size, cfg.vocab_size, rank, world)


def single_rank(cfg: ModelConfig) -> TensorParallel:
    return TensorParallel(ParallelGroup(), layout_for(cfg, 0, 1))


def for_group(cfg: ModelConfig, group: ParallelGroup) -> TensorParallel:
    return TensorParallel(group, layout_for(cfg, group.rank, group.world))

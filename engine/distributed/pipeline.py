"""Pipeline parallelism: which layers each stage owns, and the groups a stage's rank talks over.

``pipeline_parallel_size=P`` with ``tensor_parallel_size=T`` makes P x T ranks: global rank
``r = stage * T + tp_rank``. Rank 0 (stage 0, TP rank 0) is the engine process: it schedules and
samples; the others are worker processes (pool.py). Groups, all private to the engine:
- the world group (``DistributedGroup`` over all ranks): commands from rank 0, the KV block-count
  minimum, point-to-point activations between stages and the logits back to rank 0 (gloo on the CPU,
  NCCL on CUDA: the same ``send`` / ``recv`` calls);
- one TP group per stage (its T ranks): the layers' all-reduces and the logits gather, as without PP.

The split (``stage_layers``): contiguous layer ranges. The embedding sits on the first stage (a table
lookup, no FLOPs worth balancing); the final norm and LM head on the last, whose ``hidden x vocab``
matmul costs as much as several layers on a small model (SmolLM2-135M: 28 M head parameters against
3.5 M per layer) and about 2.4 layers on Llama-3.1-8B. So the split minimises the largest stage's
parameter count with the head counted on the last stage: the last stage gets fewer layers. A tied
LM head also needs the embedding table on the last stage (it is loaded there too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefixflow.engine.distributed.group import DistributedGroup, ParallelGroup, _new_group, dist
from prefixflow.engine.distributed.sharding import ShardingError
from prefixflow.engine.loading.model_config import ModelConfig


@dataclass(frozen=True)
class PipelineStage:
    """This rank's place in the pipeline; ``world`` is the all-ranks group (None with one stage)."""

    stage: int
    num_stages: int
    tp_size: int
    first_layer: int
    end_layer: int
    world: DistributedGroup | None = None

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    @property
    def num_layers(self) -> int:
        return self.end_layer - self.first_layer

    def peer(self, stage: int) -> int:
        """The global rank of this rank's TP counterpart in ``stage``."""
        tp_rank = (self.world.rank if self.world is not None else 0) % self.tp_size
        return stage * self.tp_size + tp_rank

    @property
    def last_stage_root(self) -> int:
        """The global rank that sends the gathered logits to rank 0."""
        return (self.num_stages - 1) * self.tp_size


def layer_costs(cfg: ModelConfig) -> tuple[int, int]:
    """(parameters of one decoder layer, parameters of the LM head)."""
    h, d = cfg.hidden_size, cfg.head_dim
    attn = h * d * (cfg.num_heads * 2 + cfg.num_kv_heads * 2)
    return attn + 3 * h * cfg.intermediate_size, h * cfg.vocab_size


def stage_layers(
    num_layers: int, stages: int, layer_cost: int = 1, head_cost: int = 0
) -> list[tuple[int, int]]:
    """Contiguous ``[first, end)`` per stage, minimising the largest stage cost (the head counts on the
    last stage); ties keep the even split. Every stage gets at least one layer."""
    if stages < 1 or num_layers < stages:
        raise ShardingError(
            f"pipeline_parallel_size={stages} needs at least one decoder layer per stage; this model has "
            f"{num_layers} layers (use a pipeline_parallel_size of at most {num_layers})"
        )
    best: list[int] | None = None
    best_cost = None
    for last in range(1, num_layers - stages + 2):  # layers on the last stage; the rest split evenly
        rest, others = num_layers - last, stages - 1
        counts = [rest // others + (1 if i < rest % others else 0) for i in range(others)] if others else []
        if others and min(counts) < 1:
            continue
        counts.append(last)
        cost = max(max(counts[:-1], default=0) * layer_cost, last * layer_cost + head_cost)
        if (
            best_cost is None
            or cost < best_cost
            or (cost == best_cost and best is not None and _evenness(counts) < _evenness(best))
        ):
            best, best_cost = counts, cost
    assert best is not None
    out, start = [], 0
    for n in best:
        out.append((start, start + n))
        start += n
    return out


def _evenness(counts: list[int]) -> int:
    return max(counts) - min(counts)


def split_for(cfg: ModelConfig, stages: int) -> list[tuple[int, int]]:
    layer, head = layer_costs(cfg)
    return stage_layers(cfg.num_layers, stages, layer, head)


class StageGroup(ParallelGroup):
    """The T ranks of one stage, for the layers' all-reduces and the logits gather."""

    def __init__(self, rank: int, world: int, device: Any, pg: Any) -> None:
        super().__init__(rank, world, device)
        self.pg = pg

    def all_reduce(self, tensor: Any) -> Any:
        self.pg.allreduce([tensor]).wait()
        self.stats.all_reduce_calls += 1
        return tensor

    def gather_last_dim(self, tensor: Any) -> Any:
        import torch

        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world)] if self.rank == 0 else []
        opts = dist.GatherOptions()
        opts.rootRank = 0
        self.pg.gather([parts] if self.rank == 0 else [], [tensor], opts).wait()
        return torch.cat(parts, dim=-1) if self.rank == 0 else None

    def all_reduce_min(self, value: int) -> int:
        raise RuntimeError("the KV block minimum is taken over the world group under pipeline parallelism")

    def close(self) -> None:
        try:
            self.pg.shutdown()
        except Exception:  # noqa: BLE001 - shutting down a group whose peers are gone
            pass


def stage_of(
    world: DistributedGroup, cfg: ModelConfig, pp: int, tp: int, timeout_s: float
) -> tuple[ParallelGroup, PipelineStage]:
    """This rank's TP group (within its stage) and its ``PipelineStage``; every rank calls it."""
    from datetime import timedelta

    from prefixflow.engine.distributed.group import RENDEZVOUS_TIMEOUT

    stage, tp_rank = divmod(world.rank, tp)
    first, end = split_for(cfg, pp)[stage]
    group: ParallelGroup = ParallelGroup(0, 1, world.device)
    if tp > 1:
        store = dist.PrefixStore(f"pp-stage{stage}", world._store)
        pg = _new_group(world.device, store, tp_rank, tp, RENDEZVOUS_TIMEOUT)  # peers may still be loading
        pg._set_default_timeout(timedelta(seconds=timeout_s))
        group = StageGroup(tp_rank, tp, world.device, pg)
    return group, PipelineStage(stage, pp, tp, first, end, world)

"""Which slice of every weight, head and vocabulary row each tensor-parallel rank owns.

Pure arithmetic, no torch: the model, the loader and the engine's early validation all ask the same
questions here, so a model that cannot be split fails before any worker process is started, with a
message naming the dimension and the sizes that would work.
"""

from __future__ import annotations

from dataclasses import dataclass


class ShardingError(ValueError):
    """The model (or its quantization) cannot be split across this many ranks."""


@dataclass(frozen=True)
class Partition:
    """A rank's slice ``[start, end)`` of a dimension of global size ``total``."""

    start: int
    end: int
    total: int

    @property
    def size(self) -> int:
        return self.end - self.start

    def as_slice(self) -> slice:
        return slice(self.start, self.end)


def even_partition(total: int, rank: int, world: int, what: str) -> Partition:
    """Rank ``rank``'s equal share of ``total``; ``total`` must divide evenly."""
    _check_rank(rank, world)
    if total % world:
        raise ShardingError(
            f"{what} ({total}) is not divisible by tensor_parallel_size={world}; "
            f"use a tensor_parallel_size that divides it ({_divisors_text(total)})"
        )
    size = total // world
    return Partition(rank * size, (rank + 1) * size, total)


@dataclass(frozen=True)
class AttentionShard:
    """A rank's query heads and the KV heads they read.

    When there are fewer KV heads than ranks (MQA, or GQA with few groups), each KV head is
    replicated on ``kv_replicas`` consecutive ranks: every rank keeps exactly one KV head, the one its
    query heads belong to, and its KV cache stores only that head.
    """

    q_heads: Partition
    kv_heads: Partition
    kv_replicas: int

    @property
    def num_heads(self) -> int:
        return self.q_heads.size

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads.size


def attention_shard(num_heads: int, num_kv_heads: int, rank: int, world: int) -> AttentionShard:
    q = even_partition(num_heads, rank, world, "num_attention_heads")
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ShardingError(
            f"num_attention_heads ({num_heads}) is not a multiple of num_key_value_heads ({num_kv_heads})"
        )
    if num_kv_heads >= world:
        kv = even_partition(num_kv_heads, rank, world, "num_key_value_heads")
        return AttentionShard(q, kv, 1)
    if world % num_kv_heads:
        raise ShardingError(
            f"num_key_value_heads ({num_kv_heads}) is below tensor_parallel_size={world} and does not "
            f"divide it, so KV heads cannot be replicated evenly; use a tensor_parallel_size that "
            f"divides or is a multiple of {num_kv_heads}"
        )
    replicas = world // num_kv_heads
    head = rank // replicas
    return AttentionShard(q, Partition(head, head + 1, num_kv_heads), replicas)


@dataclass(frozen=True)
class VocabShard:
    """A rank's rows of the embedding and LM head.

    The vocabulary is padded up to ``padded_per_rank * world`` so every rank holds the same number of
    rows (gather needs equal sizes); ``owned`` is the part of this rank's rows that are real tokens.
    Padded rows hold zeros and their logits are cut off after the gather.
    """

    owned: Partition
    padded_per_rank: int

    @property
    def start(self) -> int:
        return self.owned.start


def vocab_shard(vocab_size: int, rank: int, world: int) -> VocabShard:
    _check_rank(rank, world)
    per_rank = -(-vocab_size // world)
    start = min(rank * per_rank, vocab_size)
    end = min(start + per_rank, vocab_size)
    return VocabShard(Partition(start, end, vocab_size), per_rank)


@dataclass(frozen=True)
class TPLayout:
    """Everything a rank needs to build its slice of a Llama-family decoder."""

    rank: int
    world: int
    attention: AttentionShard
    intermediate: Partition
    vocab: VocabShard

    @property
    def is_first(self) -> bool:
        return self.rank == 0


def tp_layout(
    num_heads: int, num_kv_heads: int, intermediate_size: int, vocab_size: int, rank: int, world: int
) -> TPLayout:
    """The layout of rank ``rank``; raises ``ShardingError`` naming every dimension that cannot split."""
    problems: list[str] = []
    attention = intermediate = None
    try:
        attention = attention_shard(num_heads, num_kv_heads, rank, world)
    except ShardingError as exc:
        problems.append(str(exc))
    try:
        intermediate = even_partition(intermediate_size, rank, world, "intermediate_size")
    except ShardingError as exc:
        problems.append(str(exc))
    if problems or attention is None or intermediate is None:
        raise ShardingError("; ".join(problems))
    return TPLayout(rank, world, attention, intermediate, vocab_shard(vocab_size, rank, world))


def _check_rank(rank: int, world: int) -> None:
    if world < 1:
        raise ShardingError(f"tensor_parallel_size must be >= 1, got {world}")
    if not 0 <= rank < world:
        raise ShardingError(f"rank {rank} is outside [0, {world})")


def _divisors_text(n: int) -> str:
    return ", ".join(str(d) for d in range(1, min(n, 64) + 1) if n % d == 0)

"""Tensor parallelism: sharding arithmetic, process groups, worker processes and their lifecycle."""

from prefixflow.engine.distributed.group import DistributedGroup, ParallelGroup
from prefixflow.engine.distributed.pool import TensorParallelError, WorkerPool
from prefixflow.engine.distributed.sharding import ShardingError, TPLayout, tp_layout

__all__ = [
    "DistributedGroup",
    "ParallelGroup",
    "ShardingError",
    "TPLayout",
    "TensorParallelError",
    "WorkerPool",
    "tp_layout",
]

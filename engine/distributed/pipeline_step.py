"""One engine step through the pipeline stages, cut into micro-batches that are in flight at once.

Design (the equivalent of vLLM's virtual engines that keeps one scheduler): rank 0 schedules one
continuous batch per step, as without PP, and every rank receives it (the step payload). Each stage
cuts it into the same ``M`` micro-batches (contiguous runs of requests with about equal token counts)
and runs them in order: the first stage embeds micro-batch ``m`` and sends its (hidden, residual) to
the next stage, then starts on ``m + 1`` while the next stage works on ``m``. The last stage keeps
each micro-batch's logits rows and sends them all to rank 0 after the last one (one message, so the
two directions between two ranks never wait on each other on NCCL's one stream per pair), where
sampling runs as before. The cost is a fill-and-drain bubble per step of about ``(P - 1) / (M + P -
1)`` of each stage's time (``PipelineStats`` measures it: time waiting for the previous stage or for
the logits, beside compute time). Decode graphs are not used under PP (eager forward).

Transport: ``send`` / ``recv`` of the world group's compute backend (gloo on the CPU, NCCL on CUDA,
the same calls). Each TP rank of a stage sends to the same TP rank of the next (hidden states are
replicated across a stage's TP ranks after its all-reduce); only the last stage's TP rank 0 sends
logits (it holds the gathered vocabulary).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from prefixflow.engine.runner.step_inputs import StepInputs

if TYPE_CHECKING:
    from prefixflow.engine.runner.model_shard import ModelShard


@dataclass
class PipelineStats:
    compute_s: float = 0.0  # this stage's forward work
    wait_s: float = 0.0  # waiting for the previous stage's activations (rank 0: also for the logits)
    bytes_sent: int = 0  # activations and logits this rank sent
    steps: int = 0


def micro_batches(query_start_loc: np.ndarray, count: int) -> list[tuple[int, int]]:
    """Contiguous request ranges ``[a, b)`` with about equal token counts; at most ``count``, none empty."""
    b = len(query_start_loc) - 1
    count = max(1, min(count, b))
    total = int(query_start_loc[-1])
    cuts = [0]
    for m in range(1, count):
        target = total * m / count
        seq = int(np.searchsorted(query_start_loc, target, side="left"))
        if 0 < seq <= b and target - query_start_loc[seq - 1] < query_start_loc[seq] - target:
            seq -= 1  # the nearer request boundary
        seq = min(max(seq, cuts[-1] + 1), b - (count - m))
        cuts.append(seq)
    cuts.append(b)
    return [(cuts[i], cuts[i + 1]) for i in range(count)]


def sub_step(step: StepInputs, a: int, b: int) -> StepInputs:
    qsl = step.query_start_loc
    t0, t1 = int(qsl[a]), int(qsl[b])
    tables = step.block_tables
    return StepInputs(
        token_ids=step.token_ids[t0:t1],
        positions=step.positions[t0:t1],
        slot_mapping=step.slot_mapping[t0:t1],
        query_start_loc=(qsl[a : b + 1] - t0).astype(np.int32),
        seq_lens=step.seq_lens[a:b],
        block_tables=tables[a:b] if isinstance(tables, np.ndarray) else tables[a:b],
    )


def _send(world: Any, tensor: torch.Tensor, dst: int, tag: int, stats: PipelineStats) -> Any:
    stats.bytes_sent += tensor.numel() * tensor.element_size()
    return world.compute.send([tensor], dst, tag)


def _recv(world: Any, tensor: torch.Tensor, src: int, tag: int, stats: PipelineStats) -> torch.Tensor:
    start = time.perf_counter()
    world.compute.recv([tensor], src, tag).wait()
    stats.wait_s += time.perf_counter() - start
    return tensor


def run_pipeline_step(shard: ModelShard, step: StepInputs, logit_rows: np.ndarray) -> torch.Tensor | None:
    """This rank's part of one step; the full ``[len(logit_rows), vocab]`` float32 logits on rank 0."""
    from prefixflow.engine.models.llama import StepContext

    pp, stats, dev = shard.pp, shard.pipeline_stats, shard.device
    assert pp is not None and pp.world is not None
    world, hidden_size = pp.world, shard.model_cfg.hidden_size
    vocab = shard.tp.layout.vocab.owned.total
    rows = np.asarray(logit_rows, dtype=np.int64)
    pending: list[tuple[Any, torch.Tensor]] = []
    kept: list[torch.Tensor] = []
    order: list[np.ndarray] = []
    qsl = step.query_start_loc
    for m, (a, b) in enumerate(micro_batches(qsl, shard.cfg.pipeline_micro_batches or pp.num_stages)):
        part = sub_step(step, a, b)
        t0, t1, n = int(qsl[a]), int(qsl[b]), int(qsl[b]) - int(qsl[a])
        x: torch.Tensor
        residual: torch.Tensor | None = None
        if pp.is_first:
            x = torch.from_numpy(part.token_ids).to(dev)
        else:
            x = _recv(
                world,
                torch.empty((n, hidden_size), dtype=shard.dtype, device=dev),
                pp.peer(pp.stage - 1),
                2 * m,
                stats,
            )
            residual = _recv(world, torch.empty_like(x), pp.peer(pp.stage - 1), 2 * m + 1, stats)
        start = time.perf_counter()
        meta = shard.attention.build_metadata(part, dev)
        ctx = StepContext(torch.from_numpy(part.positions).to(dev), meta, shard.cos_sin_cache)
        x, residual = shard.model.forward_stage(x, residual, ctx, shard.kv_caches)
        mine = np.nonzero((rows >= t0) & (rows < t1))[0]
        if pp.is_last and len(mine):
            local = torch.from_numpy(rows[mine] - t0).to(dev)
            logits = shard.model.compute_logits(x[local])
            if logits is not None:
                kept.append(logits)
        order.append(mine)
        stats.compute_s += time.perf_counter() - start
        if not pp.is_last:
            assert residual is not None
            for i, t in enumerate((x.contiguous(), residual.contiguous())):
                pending.append((_send(world, t, pp.peer(pp.stage + 1), 2 * m + i, stats), t))
    for work, _ in pending:
        work.wait()
    stats.steps += 1
    root = pp.last_stage_root
    if not len(rows):
        return None
    if pp.is_last and world.rank == root:
        gathered = torch.cat(kept).contiguous()
        if root == 0:
            return gathered  # a single stage (not reached: PP has at least two)
        _send(world, gathered, 0, 1 << 20, stats).wait()
        return None
    if world.rank != 0:
        return None
    got = _recv(world, torch.empty((len(rows), vocab), dtype=torch.float32, device=dev), root, 1 << 20, stats)
    out = torch.empty_like(got)
    out[torch.from_numpy(np.concatenate(order)).to(dev)] = got
    if dev.type == "cuda":
        torch.cuda.current_stream(dev).synchronize()
    return out

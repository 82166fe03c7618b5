"""One engine step through the pipeline stages: every rank's part, and rank 0's hand-over in two halves.

Each stage cuts a step into ``M`` micro-batches (contiguous runs of requests with about equal token
counts) and runs them in order: the first stage embeds micro-batch ``m`` and sends its (hidden,
residual) on, then starts on ``m + 1`` while the next stage works on ``m``. The last stage keeps each
micro-batch's logits rows and sends them all to rank 0 after the last one (one message). Steps are
kept in flight across step boundaries by rank 0 (``pipeline_inflight.py``: one step per virtual
engine): here a worker never waits for its own sends to land before taking the next command; it waits
for the previous step's sends just before posting this step's, so a stage is never held by a
neighbour that is still busy with an earlier step. Every rank numbers the steps it ran
(``PipelineStats.steps``, the same count everywhere since every rank runs every step), and the tags
carry that number, so the messages of two steps in flight never match each other.

Transport: ``send`` / ``recv`` of the world group's compute backend (gloo on the CPU, NCCL on CUDA,
the same calls). Each TP rank of a stage sends to the same TP rank of the next (hidden states are
replicated across a stage's TP ranks after its all-reduce); only the last stage's TP rank 0 sends
logits (it holds the gathered vocabulary). Decode graphs are not used under PP (eager forward).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from prefixflow.engine.runner.step_inputs import StepInputs

if TYPE_CHECKING:
    from prefixflow.engine.runner.model_shard import ModelShard

TAG_STEPS = 64  # steps whose tags differ: far more than are ever in flight at once
TAG_MICRO = 4096  # tags per step for activations: 2 per micro-batch
LOGITS_TAG = 1 << 20


@dataclass
class PipelineStats:
    compute_s: float = 0.0  # this stage's forward work
    wait_s: float = 0.0  # waiting for the previous stage's activations (rank 0: also for the logits)
    bytes_sent: int = 0  # activations and logits this rank sent
    steps: int = 0


@dataclass
class StageWork:
    """One step's part on this rank: what it computed and the sends it posted or still has to post."""

    seq: int
    rows: np.ndarray
    order: list[np.ndarray] = field(default_factory=list)  # each micro-batch's share of ``rows``
    kept: list[torch.Tensor] = field(default_factory=list)  # logits per micro-batch (last stage)
    unsent: list[tuple[torch.Tensor, int, int]] = field(default_factory=list)  # (tensor, dst, tag)


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


def step_tag(seq: int, m: int, i: int) -> int:
    return (seq % TAG_STEPS) * TAG_MICRO + (2 * m + i) % TAG_MICRO


def logits_tag(seq: int) -> int:
    return LOGITS_TAG + seq % TAG_STEPS


def _recv(world: Any, tensor: torch.Tensor, src: int, tag: int, stats: PipelineStats) -> torch.Tensor:
    start = time.perf_counter()
    world.compute.recv([tensor], src, tag).wait()
    stats.wait_s += time.perf_counter() - start
    return tensor


def post_sends(shard: ModelShard, sends: list[tuple[torch.Tensor, int, int]], first: bool = True) -> None:
    """Post sends; a step's ``first`` waits until the previous step's have landed (which bounds what
    is in the air, and the pending list keeps each tensor alive until its send is done)."""
    pp, stats = shard.pp, shard.pipeline_stats
    assert pp is not None and pp.world is not None
    if first:
        wait_sends(shard)
    for tensor, dst, tag in sends:
        stats.bytes_sent += tensor.numel() * tensor.element_size()
        shard.pipeline_pending.append((pp.world.compute.send([tensor], dst, tag), tensor))


def wait_sends(shard: ModelShard) -> None:
    """Block until every send this rank posted was received (before any command but a step)."""
    pending, shard.pipeline_pending = shard.pipeline_pending, []
    start = time.perf_counter()
    for work, _ in pending:
        work.wait()
    shard.pipeline_stats.wait_s += time.perf_counter() - start


def compute_stage(shard: ModelShard, step: StepInputs, logit_rows: np.ndarray, send_now: bool) -> StageWork:
    """This rank's layers over the step's micro-batches. ``send_now``: post each micro-batch's
    activations as soon as it is done (workers; rank 0 without steps in flight), else keep them in
    ``unsent`` for rank 0 to post when its peers' order allows (pipeline_inflight.py)."""
    from prefixflow.engine.models.llama import StepContext

    pp, stats, dev = shard.pp, shard.pipeline_stats, shard.device
    assert pp is not None and pp.world is not None
    world, hidden_size = pp.world, shard.model_cfg.hidden_size
    work = StageWork(stats.steps, np.asarray(logit_rows, dtype=np.int64))
    stats.steps += 1
    rows, qsl = work.rows, step.query_start_loc
    count = shard.cfg.pipeline_micro_batches or default_micro_batches(shard.cfg)
    for m, (a, b) in enumerate(micro_batches(qsl, count)):
        part = sub_step(step, a, b)
        t0, t1, n = int(qsl[a]), int(qsl[b]), int(qsl[b]) - int(qsl[a])
        x: torch.Tensor
        residual: torch.Tensor | None = None
        if pp.is_first:
            x = torch.from_numpy(part.token_ids).to(dev)
        else:
            src = pp.peer(pp.stage - 1)
            x = torch.empty((n, hidden_size), dtype=shard.dtype, device=dev)
            _recv(world, x, src, step_tag(work.seq, m, 0), stats)
            residual = _recv(world, torch.empty_like(x), src, step_tag(work.seq, m, 1), stats)
        start = time.perf_counter()
        meta = shard.attention.build_metadata(part, dev)
        ctx = StepContext(torch.from_numpy(part.positions).to(dev), meta, shard.cos_sin_cache)
        x, residual = shard.model.forward_stage(x, residual, ctx, shard.kv_caches)
        mine = np.nonzero((rows >= t0) & (rows < t1))[0]
        if pp.is_last and len(mine):
            local = torch.from_numpy(rows[mine] - t0).to(dev)
            logits = shard.model.compute_logits(x[local])
            if logits is not None:
                work.kept.append(logits)
        work.order.append(mine)
        stats.compute_s += time.perf_counter() - start
        if not pp.is_last:
            assert residual is not None
            sends = [
                (t.contiguous(), pp.peer(pp.stage + 1), step_tag(work.seq, m, i))
                for i, t in enumerate((x, residual))
            ]
            if send_now:
                post_sends(shard, sends, first=m == 0)
            else:
                work.unsent.extend(sends)
    if pp.is_last and world.rank == pp.last_stage_root and len(rows):
        post_sends(shard, [(torch.cat(work.kept).contiguous(), 0, logits_tag(work.seq))])
    return work


def default_micro_batches(cfg: Any) -> int:
    """One micro-batch per step when steps of several virtual engines are in flight, else one per stage."""
    return 1 if virtual_engines(cfg) > 1 else int(cfg.pipeline_parallel_size)


def virtual_engines(cfg: Any) -> int:
    """How many steps rank 0 keeps in flight (``pipeline_virtual_engines``; default: one per stage)."""
    if cfg.pipeline_parallel_size == 1:
        return 1
    v = cfg.pipeline_virtual_engines
    return int(cfg.pipeline_parallel_size if v is None else v)


def receive_logits(shard: ModelShard, work: StageWork) -> torch.Tensor | None:
    """Rank 0: the step's ``[len(rows), vocab]`` float32 logits in row order (None without rows)."""
    pp, dev = shard.pp, shard.device
    assert pp is not None and pp.world is not None
    if not len(work.rows):
        return None
    vocab = shard.tp.layout.vocab.owned.total
    got = torch.empty((len(work.rows), vocab), dtype=torch.float32, device=dev)
    _recv(pp.world, got, pp.last_stage_root, logits_tag(work.seq), shard.pipeline_stats)
    out = torch.empty_like(got)
    out[torch.from_numpy(np.concatenate(work.order)).to(dev)] = got
    if dev.type == "cuda":
        torch.cuda.current_stream(dev).synchronize()
    return out


def run_pipeline_step(shard: ModelShard, step: StepInputs, logit_rows: np.ndarray) -> torch.Tensor | None:
    """This rank's part of one step, start to end; the full logits on rank 0 (None elsewhere)."""
    pp = shard.pp
    assert pp is not None and pp.world is not None
    work = compute_stage(shard, step, logit_rows, send_now=True)
    if pp.world.rank != 0:
        return None
    return receive_logits(shard, work)

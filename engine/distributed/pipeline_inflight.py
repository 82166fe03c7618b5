"""Rank 0's steps in flight under pipeline parallelism: start a step while earlier ones are still in
later stages, collect each step's logits when its turn comes.

``launch`` posts the step's command without waiting for the workers to take it (they may be busy with
earlier steps), runs stage 0's layers on it, and keeps its activations back until the order of
messages allows: before handing over step ``j`` it receives the logits of step ``j - (P - 1)``. On
P = 2 that makes rank 0's messages alternate (send j, receive j's logits, send j + 1 ...), the order
stage 1 posts its own in: with NCCL's one stream per pair of ranks, any other order could wait
forever (rank 0 blocked sending j + 1 while stage 1 is blocked sending j's logits). Stage 0's compute
of step j still overlaps the later stages' work on step j - 1, which is the point: the stages stop
idling at step boundaries. ``collect`` returns a step's logits, receiving them (and those of older
steps, in order) if they have not arrived yet. ``drain`` collects everything, before any command
that is not a step.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np
import torch

from prefixflow.engine.distributed.pipeline_step import StageWork, compute_stage, post_sends, receive_logits

if TYPE_CHECKING:
    from prefixflow.engine.distributed.pool import WorkerPool
    from prefixflow.engine.runner.model_shard import ModelShard
    from prefixflow.engine.runner.step_inputs import StepInputs


class InFlightSteps:
    def __init__(self, pool: WorkerPool, shard: ModelShard) -> None:
        assert shard.pp is not None
        self.pool, self.shard = pool, shard
        self.lag = shard.pp.num_stages - 2  # steps whose logits may be outstanding when one is handed over
        self.outstanding: deque[StageWork] = deque()  # handed over, logits not received yet (oldest first)
        self.received: dict[int, torch.Tensor | None] = {}  # step number -> its logits, until collected
        self.max_in_flight = 0  # the most steps ever started and not yet collected (tests, benchmarks)
        self._started = 0

    def launch(self, command: int, payload: torch.Tensor, step: StepInputs, rows: np.ndarray) -> StageWork:
        self.pool.post(command, payload)

        def run() -> StageWork:
            work = compute_stage(self.shard, step, rows, send_now=False)
            while len(self.outstanding) > self.lag:
                self._receive_oldest()
            post_sends(self.shard, work.unsent)
            work.unsent = []
            self.outstanding.append(work)
            return work

        work = self.pool.guarded(run)
        self._started += 1
        self.max_in_flight = max(self.max_in_flight, self._started)
        return work

    def collect(self, work: StageWork) -> torch.Tensor | None:
        """``work``'s logits (rank 0's ``[rows, vocab]`` float32), received now if still outstanding."""

        def run() -> torch.Tensor | None:
            while work.seq not in self.received:
                self._receive_oldest()
            return self.received.pop(work.seq)

        logits = self.pool.guarded(run)
        self._started -= 1
        if not self.outstanding and not self.received and self._started == 0:
            self.pool.settle()
        return logits

    def drain(self) -> None:
        """Receive every outstanding step's logits (kept for ``collect``), so another command can run."""
        if not self.outstanding:
            return

        def run() -> None:
            while self.outstanding:
                self._receive_oldest()

        self.pool.guarded(run)
        self.pool.settle()

    def _receive_oldest(self) -> None:
        work = self.outstanding.popleft()
        self.received[work.seq] = receive_logits(self.shard, work)

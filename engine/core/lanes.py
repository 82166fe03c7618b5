"""Pipeline parallelism's virtual engines on rank 0: one step in flight per lane of requests.

The scheduler splits its running requests into V lanes over one block pool (scheduler.py). Each
``step`` first starts a step for every lane that has none in flight and has work (stage 0 computes
it while the later stages are still busy with the previous lanes' steps), then finishes the oldest
step in flight: its logits arrive, it is sampled and the scheduler updated, and only that lane's
requests move on. A lane's next step needs its sampled tokens, so it is started by a later ``step``
call, while another lane's step is in the later stages. So with V = P lanes of similar size every
stage has work at each step boundary, which one scheduler (one step at a time) cannot give.

Why this is exact: every stage runs the steps in the order rank 0 started them, and each stage owns
its layers' KV, so a step reads the KV of everything started before it as if steps ran one at a time
(a prefix another lane is computing is held back by the scheduler until it is committed, as within
one lane). Blocks a finished or preempted request frees are reused only by steps started later.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from prefixflow.engine.core.scheduler import Scheduler
from prefixflow.engine.core.step_types import SchedulerOutput
from prefixflow.engine.runner.model_runner import LaunchedStep, ModelRunner


@dataclass(frozen=True)
class LaneStep:
    lane: int
    scheduled: SchedulerOutput
    launched: LaunchedStep


class LaneDriver:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, before_launch: Callable[[], None]) -> None:
        self.scheduler, self.runner = scheduler, runner
        self.before_launch = before_launch  # the step's block copies (host tier), before it runs
        self.in_flight: deque[LaneStep] = deque()
        self._next = 0  # the lane to try first, round robin

    @property
    def busy(self) -> bool:
        return bool(self.in_flight)

    def fill(self) -> None:
        """Start a step for every idle lane that can schedule one (in round-robin order). A second
        round runs when the first started nothing: a lane that preempted all its requests freed
        blocks that a lane tried before it could not get."""
        lanes = len(self.scheduler.lanes)
        for _ in range(2):
            taken = {s.lane for s in self.in_flight}
            for k in range(lanes):
                lane = (self._next + k) % lanes
                if lane in taken or not self.scheduler.lane_has_work(lane):
                    continue
                scheduled = self.scheduler.schedule(lane)
                if not scheduled:
                    continue  # the pool is held by lanes in flight: this lane waits for them
                self.before_launch()
                self.in_flight.append(LaneStep(lane, scheduled, self.runner.launch(scheduled)))
                taken.add(lane)
            if self.in_flight or not self.scheduler.has_work():
                break
        self._next = (self._next + 1) % lanes

    def oldest(self) -> LaneStep:
        """The step to finish next (the first started); ``fill`` first."""
        if not self.in_flight:
            raise RuntimeError("scheduler made no progress (no request fits the KV pool)")
        return self.in_flight.popleft()

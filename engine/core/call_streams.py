"""Several ``generate_stream`` calls on one engine, each owning exactly its own requests.

The engine runs one step loop for every queued request. A call that steps the engine may finish
another call's requests; those outputs go to the owner's inbox, and the owner yields them the next
time it is read. So streams read in any interleaving each yield exactly their own outputs, the same
as a lone call, and closing a stream (or dropping it) aborts only its own requests.

Single-threaded by design: one ``LLM`` is driven from one thread (interleaved generators are fine).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from prefixflow.engine.core.llm_engine import LLMEngine
from prefixflow.engine.core.request import RequestSpec
from prefixflow.engine.outputs import RequestOutput


class CallStreams:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._owner: dict[int, deque[RequestOutput]] = {}  # request key -> its call's inbox

    def run(self, specs: list[RequestSpec]) -> Iterator[RequestOutput]:
        """Queue ``specs`` and yield each of their outputs as it finishes; abort the rest on close."""
        inbox: deque[RequestOutput] = deque()
        pending: set[int] = set()
        try:
            for spec in specs:
                key = self.engine.add_request(spec)
                pending.add(key)
                self._owner[key] = inbox
            remaining = len(pending)
            while remaining:
                if not inbox:
                    if not self.engine.has_unfinished():
                        raise RuntimeError("this call's requests were aborted from outside the stream")
                    self._step()
                    continue
                out = inbox.popleft()
                remaining -= 1
                yield out
        finally:
            unfinished = [k for k in pending if k in self._owner]
            for key in pending:
                self._owner.pop(key, None)
            if unfinished:
                self.engine.abort(unfinished)

    def _step(self) -> None:
        for key, out in self.engine.step().items():
            inbox = self._owner.pop(key, None)
            if inbox is not None:  # None: its call was closed after this step was scheduled
                inbox.append(out)

"""The Jinja2 sandbox prompt templates render in, with a time and a size limit per row.

Templates come from job configs that may be shared, so besides Jinja's sandbox (no attribute access to
internals, ``range`` capped at 100,000) a render is stopped once it runs longer than
``template_limits.seconds`` (a trace function checks the clock while template code runs: nested loops
cannot hang a run) or produces more than ``template_limits.max_chars`` characters; ``*`` and ``**`` on
huge operands and calls with huge integer arguments are refused before they allocate. A row over a limit
becomes a ``template_limit`` error row.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from functools import lru_cache
from types import FrameType
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from prefixflow.pipeline.config import TemplateLimits
from prefixflow.pipeline.template_cells import is_none

_CHECK_EVERY = 256  # trace events between clock reads
_PADDING = {"center", "ljust", "rjust", "zfill", "expandtabs"}  # str methods that allocate what they are told
_local = threading.local()


class TemplateLimitExceeded(Exception):
    """A render ran over its time or size limit."""


def _max_chars() -> int:
    return int(getattr(_local, "max_chars", TemplateLimits().max_chars))


class LimitedSandbox(ImmutableSandboxedEnvironment):
    """Refuses ``a * n``, ``a ** n`` and ``s.center(n)``-like calls over the size limit before they allocate."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        limit = _max_chars()
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(times, int) and len(seq) * times > limit:
                    raise TemplateLimitExceeded(f"'*' would build {len(seq) * times:,} items (template_limits.max_chars is {limit:,})")
        if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64 and abs(left) > 1:
            raise TemplateLimitExceeded(f"'**' with exponent {right} is refused in templates")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        if isinstance(getattr(__obj, "__self__", None), (str, bytes)) and getattr(__obj, "__name__", "") in _PADDING:
            limit = _max_chars()
            for value in (*args, *kwargs.values()):
                if isinstance(value, int) and value > limit:
                    raise TemplateLimitExceeded(f"{__obj.__name__}({value:,}) is over template_limits.max_chars ({limit:,})")
        return super().call(__context, __obj, *args, **kwargs)


ENV = LimitedSandbox(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
ENV.tests["none"] = is_none  # a null cell is a MissingCell, and still `is none` (template_cells.py)


@lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    """Compile once per process; raises jinja2.TemplateSyntaxError on bad syntax."""
    return ENV.from_string(source)


def render_limited(template: jinja2.Template, context: dict[str, Any], limits: TemplateLimits) -> str:
    """``template.render(**context)`` within ``limits``; raises TemplateLimitExceeded when over one."""
    deadline = time.monotonic() + limits.seconds
    ticks = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        nonlocal ticks
        ticks += 1
        if ticks % _CHECK_EVERY == 0 and time.monotonic() > deadline:
            raise TemplateLimitExceeded(f"rendering took longer than {limits.seconds:g} s (template_limits.seconds)")
        return tracer

    previous = sys.gettrace()
    saved_limit = getattr(_local, "max_chars", None)
    _local.max_chars = limits.max_chars
    sys.settrace(tracer)
    try:
        pieces: list[str] = []
        size = 0
        for piece in template.generate(**context):
            size += len(piece)
            if size > limits.max_chars:
                raise TemplateLimitExceeded(f"the rendered prompt is over {limits.max_chars:,} characters "
                                            "(template_limits.max_chars)")  # fmt: skip
            pieces.append(piece)
        return "".join(pieces)
    finally:
        sys.settrace(previous)
        _local.max_chars = saved_limit

"""The Jinja2 sandbox prompt templates render in, with a time and a size limit per row.

Templates come from job configs that may be shared, so besides Jinja's sandbox (no attribute access to
internals, ``range`` capped at 100,000) a render is stopped once it runs longer than
``template_limits.seconds`` (a trace function checks the clock while template code runs: nested loops
cannot hang a run) or produces more than ``template_limits.max_chars`` characters; ``*`` and ``**`` on
huge operands, calls with huge integer arguments, widths and precisions of ``%``-formats and ``str.format``
specs, and the sizes of the ``center``, ``indent``, ``batch``, ``slice`` and ``replace`` filters are refused
before they allocate (``LimitedSandbox``). A row over a limit becomes a ``template_limit`` error row.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import time
from collections.abc import Callable
from functools import lru_cache
from types import FrameType
from typing import Any

import jinja2
import jinja2.filters
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter

from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.job.config import TemplateLimits
from prefixflow.pipeline.prompts.template_cells import is_none

_CHECK_EVERY = 256  # trace events between clock reads
_PADDING = {"center", "ljust", "rjust", "zfill", "expandtabs"}  # str methods that allocate what they are told
_local = threading.local()


class TemplateLimitExceeded(Exception):
    """A render ran over its time or size limit."""


def _max_chars() -> int:
    return int(getattr(_local, "max_chars", TemplateLimits().max_chars))


def _refuse_big(what: str, numbers: Any) -> None:
    """Raise when any of ``numbers`` (ints) is over the size limit: ``what`` would allocate that much."""
    limit = _max_chars()
    for n in numbers:
        if isinstance(n, int) and not isinstance(n, bool) and n > limit:
            raise TemplateLimitExceeded(f"{what} with {n:,} is over template_limits.max_chars ({limit:,})")


_DIGITS = re.compile(r"\d+")
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?.")


def check_printf(fmt: str, args: Any) -> None:
    """``fmt % args`` (the ``format`` filter, the ``%`` operator): refuse a width or precision over the
    size limit, written in ``fmt`` (``%1000000000s``) or taken from the arguments (``%*s``)."""
    stars = False
    for m in _PRINTF.finditer(fmt):
        _refuse_big(f"the format {m.group(0)!r}", (int(g) for g in m.groups() if g and g != "*"))
        stars = stars or "*" in m.groups()
    if stars:
        _refuse_big("a '*' width or precision", args if isinstance(args, tuple) else (args,))


class _LimitedFormatter(SandboxedFormatter):
    """``str.format``: every replacement field's spec (after nested fields are filled in) is checked for
    a width or precision over the size limit before Python pads to it."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        _refuse_big(f"the format spec {format_spec[:20]!r}", (int(d) for d in _DIGITS.findall(format_spec)))
        return super().format_field(value, format_spec)


def _limited_filter(name: str, sizes: Callable[..., Any]) -> Callable[..., Any]:
    """Jinja's filter ``name``, refusing before the call when ``sizes(*args, **kwargs)`` holds a number
    over the size limit (the widths and counts the filter allocates)."""
    original = ENV_FILTERS[name]
    skip = 1 if hasattr(original, "jinja_pass_arg") else 0  # replace gets the eval context first

    def limited(*args: Any, **kwargs: Any) -> Any:
        _refuse_big(f"the {name!r} filter", sizes(*args[skip:], **kwargs))
        return original(*args, **kwargs)

    return functools.update_wrapper(limited, original)


def _format_filter(value: Any, *args: Any, **kwargs: Any) -> Any:
    check_printf(str(value), kwargs or args)
    return ENV_FILTERS["format"](value, *args, **kwargs)


def _replace_size(value: Any, old: Any = "", new: Any = "", count: Any = None, *_: Any) -> list[int]:
    """What ``replace`` can grow a string to: every occurrence (or ``count`` of them) made ``new``."""
    text, new_text = str(value), str(new)
    times = len(text) + 1 if count is None or not isinstance(count, int) else count
    return [len(text) + max(times, 0) * len(new_text)]


def _indent_size(value: Any, width: Any = 4, *_: Any, **kwargs: Any) -> list[int]:
    width = kwargs.get("width", width)
    return [width * (str(value).count("\n") + 1)] if isinstance(width, int) else []


def _arg(name: str, position: int, default: Any) -> Callable[..., list[Any]]:
    """The filter argument ``name`` (``position`` after the value), as a one-item size list."""

    def size(*args: Any, **kwargs: Any) -> list[Any]:
        return [kwargs.get(name, args[position] if len(args) > position else default)]

    return size


ENV_FILTERS = dict(jinja2.filters.FILTERS)
_SIZED_FILTERS: dict[str, Callable[..., Any]] = {
    "center": _arg("width", 1, 80),
    "indent": _indent_size,
    "batch": _arg("linecount", 1, 0),
    "slice": _arg("slices", 1, 0),
    "replace": _replace_size,
}


class LimitedSandbox(ImmutableSandboxedEnvironment):
    """Refuses, before they allocate, what would build something over the size limit: ``a * n``,
    ``a ** n``, ``s.center(n)``-like str methods, widths and precisions in ``%``-formats (the ``%``
    operator and the ``format`` filter) and in ``str.format`` specs, and the ``center``, ``indent``,
    ``batch``, ``slice`` and ``replace`` filters' sizes."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters.update({name: _limited_filter(name, sizes) for name, sizes in _SIZED_FILTERS.items()})
        self.filters["format"] = _format_filter

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        f_self = getattr(value, "__self__", None)
        if wrapped is None or type(f_self) is not str:
            return wrapped  # not a str.format, or Markup's escaping formatter (autoescape is off)
        formatter = _LimitedFormatter(self)
        if value.__name__ == "format_map":

            def limited_map(mapping: Any) -> str:
                return formatter.vformat(f_self, (), mapping)

            return limited_map

        def limited(*args: Any, **kwargs: Any) -> str:
            return formatter.vformat(f_self, args, kwargs)

        return limited

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        limit = _max_chars()
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if (
                    isinstance(seq, (str, bytes, list, tuple))
                    and isinstance(times, int)
                    and len(seq) * times > limit
                ):
                    raise TemplateLimitExceeded(
                        f"'*' would build {len(seq) * times:,} items (template_limits.max_chars is {limit:,})"
                    )
        if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64 and abs(left) > 1:
            raise TemplateLimitExceeded(f"'**' with exponent {right} is refused in templates")
        if operator == "%" and isinstance(left, str):
            check_printf(left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        if (
            isinstance(getattr(__obj, "__self__", None), (str, bytes))
            and getattr(__obj, "__name__", "") in _PADDING
        ):
            limit = _max_chars()
            for value in (*args, *kwargs.values()):
                if isinstance(value, int) and value > limit:
                    raise TemplateLimitExceeded(
                        f"{__obj.__name__}({value:,}) is over template_limits.max_chars ({limit:,})"
                    )
        return super().call(__context, __obj, *args, **kwargs)


ENV = LimitedSandbox(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
ENV.tests["none"] = is_none  # a null cell is a MissingCell, and still `is none` (template_cells.py)


@lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    """Compile once per process; raises jinja2.TemplateSyntaxError on bad syntax."""
    return ENV.from_string(source)


def check_template(source: str | None, path: str) -> None:
    """Fail at load, naming the job key, when ``source`` is not a valid Jinja2 template."""
    if source is None:
        return
    try:
        compile_template(source)
    except Exception as exc:  # jinja2.TemplateSyntaxError and friends
        raise JobConfigError(f"job config: {path}: invalid Jinja2 template: {exc}") from exc


def render_limited(template: jinja2.Template, context: dict[str, Any], limits: TemplateLimits) -> str:
    """``template.render(**context)`` within ``limits``; raises TemplateLimitExceeded when over one."""
    deadline = time.monotonic() + limits.seconds
    ticks = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        nonlocal ticks
        ticks += 1
        if ticks % _CHECK_EVERY == 0 and time.monotonic() > deadline:
            raise TemplateLimitExceeded(
                f"rendering took longer than {limits.seconds:g} s (template_limits.seconds)"
            )
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
                raise TemplateLimitExceeded(
                    f"the rendered prompt is over {limits.max_chars:,} characters (template_limits.max_chars)"
                )
            pieces.append(piece)
        return "".join(pieces)
    finally:
        sys.settrace(previous)
        _local.max_chars = saved_limit

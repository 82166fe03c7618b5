"""The batch_inference flow's job parameters, generated from the job model's options.

Prefect reads a flow's parameters from its function signature (``inspect.signature``: the schema the UI
and the API validate against, and the binding of a run's parameters). ``job_parameters`` gives the flow
function a signature with one typed, keyword-only parameter per job option (pipeline/job/flags.py
``JOB_OPTIONS``, built from the job model), the same names and help as `prefixflow run`'s flags, so the
flow never lists them by hand. The function itself takes them as ``**job_options``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

from prefixflow.pipeline.job.flags import JOB_OPTIONS, STORAGE_OPTIONS, JobOption

F = TypeVar("F", bound=Callable[..., Any])


def job_parameters(extra: Mapping[str, Any] | None = None) -> Callable[[F], F]:
    """Replace the function's ``**job_options`` with one keyword-only parameter per job option, placed
    after its last positional parameter (Prefect's UI orders the form by position), each
    ``<the option's value type> | None = None`` (``extra``: more ``Annotated`` metadata by name, e.g. a
    JSON schema). Their help goes into the docstring's ``Args:``, where Prefect finds descriptions."""
    extra = dict(extra or {})

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        params = list(signature.parameters.values())
        rest = [p for p in params if p.kind is not p.VAR_KEYWORD]
        if len(rest) != len(params) - 1:
            raise TypeError(f"{fn.__name__} takes the job options as **job_options")
        options = (*JOB_OPTIONS, *STORAGE_OPTIONS)
        clash = {o.name for o in options} & {p.name for p in rest}
        if clash:
            raise TypeError(f"{fn.__name__}: {sorted(clash)} are job options; take them from **job_options")
        at = next((i for i, p in enumerate(rest) if p.kind is p.KEYWORD_ONLY), len(rest))
        generated = [_parameter(o, extra.get(o.name)) for o in options]
        fn.__signature__ = signature.replace(parameters=[*rest[:at], *generated, *rest[at:]])  # type: ignore[attr-defined]
        fn.__annotations__ = {
            **{p.name: p.annotation for p in fn.__signature__.parameters.values()},  # type: ignore[attr-defined]
            "return": signature.return_annotation,
        }
        fn.__doc__ = _with_args(fn.__doc__ or "", options)
        return fn

    return decorate


def _parameter(option: JobOption, metadata: Any) -> inspect.Parameter:
    hint: Any = option.value_type | None
    if metadata is not None:
        hint = Annotated[hint, metadata]
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=hint)


def _with_args(doc: str, options: tuple[JobOption, ...]) -> str:
    """The docstring with an ``Args:`` section of the job options (Google style, as Prefect parses)."""
    lines = [f"    {o.name}: {o.help} (flag {o.flag})" for o in options]
    return inspect.cleandoc(doc) + "\n\nArgs:\n" + "\n".join(lines) + "\n"

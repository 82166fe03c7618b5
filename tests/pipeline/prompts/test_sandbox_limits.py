"""Issue 22 item 7: the template sandbox refuses widths and counts over its size limit *before* the call.

`{{ '%1000000000s' | format('x') }}` ran 35 s and peaked at 3.9 GB; center/indent/str.format widths
each allocated about 1 GB. Here the limit is 1,000 characters and the widths 10 million: a sandbox that
checks only the rendered size would still allocate 10 MB per case, which the peak check catches."""

from __future__ import annotations

import tracemalloc

import pytest

from prefixflow.pipeline.errors import TEMPLATE_LIMIT, RowError
from prefixflow.pipeline.job.config import TemplateLimits
from prefixflow.pipeline.prompts.render import render_template

LIMITS = TemplateLimits(seconds=10.0, max_chars=1_000)
BIG = 10_000_000
ROW = {"x": "x", "long": "a" * 900, "new": "b" * 900, "items": [1, 2, 3]}


@pytest.mark.parametrize(
    "source",
    [
        f"{{{{ '%{BIG}s' | format('x') }}}}",
        f"{{{{ '%.{BIG}f' | format(1.0) }}}}",
        f"{{{{ '%*s' | format({BIG}, 'x') }}}}",
        f"{{{{ '%(a){BIG}s' | format(a='x') }}}}",
        f"{{{{ '%{BIG}s' % x }}}}",
        f"{{{{ x | center({BIG}) }}}}",
        f"{{{{ x | center(width={BIG}) }}}}",
        f"{{{{ 'a\\nb' | indent({BIG}) }}}}",
        f"{{{{ x | indent({BIG}, true) }}}}",
        f"{{{{ '{{:>{BIG}}}'.format(x) }}}}",
        f"{{{{ '{{:>{{w}}}}'.format(x, w={BIG}) }}}}",
        f"{{{{ '{{0:.{BIG}f}}'.format(1.5) }}}}",
        f"{{{{ '{{v:>{BIG}}}'.format_map({{'v': x}}) }}}}",
        f"{{{{ x.center({BIG}) }}}}",
        f"{{{{ x.zfill({BIG}) }}}}",
        f"{{{{ items | batch({BIG}, 0) | list }}}}",
        f"{{{{ items | slice({BIG}) | list }}}}",
        "{{ long | replace('', new) }}",
    ],
)
def test_widths_and_counts_over_the_limit_are_refused_before_they_allocate(source: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(RowError) as info:
            render_template(source, dict(ROW), LIMITS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.error_class == TEMPLATE_LIMIT and "template_limits.max_chars" in info.value.message
    assert peak < 2_000_000, f"{peak:,} bytes allocated before the refusal"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ '%5s|%.2f|%-3d|' | format('x', 1.5, 7) }}", "    x|1.50|7  |"),
        ("{{ '%s and %s' % (x, x) }}", "x and x"),
        ("{{ '%(a)s' | format(a=x) }}", "x"),
        ("{{ x | center(5) }}", "  x  "),
        ("{{ 'a\nb' | indent(2) }}", "a\n  b"),
        ("{{ '{:>5}|{:.2f}'.format(x, 2.5) }}", "    x|2.50"),
        ("{{ '{v}!'.format_map({'v': x}) }}", "x!"),
        ("{{ '{:>{w}}'.format(x, w=3) }}", "  x"),
        ("{{ items | batch(2, 0) | list }}", "[[1, 2], [3, 0]]"),
        ("{{ items | slice(2) | list }}", "[[1, 2], [3]]"),
        ("{{ 'abc' | replace('b', 'X') }}", "aXc"),
        ("{{ 'abcb' | replace('b', 'X', 1) }}", "aXcb"),
    ],
)
def test_ordinary_formatting_still_works(source: str, expected: str) -> None:
    assert render_template(source, dict(ROW), LIMITS) == expected

"""Find templates that put row-specific content before static text, which stops rows sharing that text.

The prefix cache shares only a common *head*: "{{ text }}\n\nClassify the sentiment..." makes every
prompt unique from its first token, while "Classify the sentiment...\n\n{{ text }}" shares the whole
instruction. Templates are read from their Jinja2 syntax tree; a verbatim prompt column is checked on
the sampled values (a long common ending and a short common beginning).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import nodes

from prefixflow.pipeline.prompts.render import parse_template


@dataclass(frozen=True)
class OrderFlag:
    variable: str  # the template variable (or column) whose content comes first
    static_tokens_after: int  # static tokens placed after it, which every row could otherwise share
    static_tokens_before: int
    distinct_values: int  # of the variable in the sample
    message: str


def _names(node: nodes.Node) -> set[str]:
    """Row values a node reads (find_all looks below the node only, so a bare ``{{ x }}`` is checked too)."""
    found: list[nodes.Name] = [node] if isinstance(node, nodes.Name) else []
    found += node.find_all(nodes.Name)
    return {n.name for n in found if n.ctx == "load"}


def _segments(template: nodes.Template) -> list[tuple[str, str | set[str]]]:
    """The template's output in order: ("static", text) or ("variable", names it reads)."""
    out: list[tuple[str, str | set[str]]] = []

    def walk(node: nodes.Node) -> None:
        if isinstance(node, nodes.Output):
            for child in node.nodes:
                if isinstance(child, nodes.TemplateData):
                    out.append(("static", child.data))
                else:
                    out.append(("variable", _names(child) or {"<expression>"}))
        elif isinstance(node, (nodes.If, nodes.For, nodes.With, nodes.FilterBlock)):
            out.append(("variable", _names(node) or {"<block>"}))
        else:
            for inner in node.iter_child_nodes():
                walk(inner)

    walk(template)
    return out


def check_template(
    source: str,
    rows: Sequence[dict[str, Any]],
    count_tokens: Callable[[str], int],
    block_size: int,
    aliases: dict[str, str] | None = None,
) -> OrderFlag | None:
    """A flag when static text of at least one block follows the first row-varying variable and is at
    least as long as the static head (or a tenth of the prompt), else None. A variable with few distinct
    values in the sample (a category) only splits sharing into groups and is not flagged."""
    segments = _segments(parse_template(source))
    before = after = 0
    first: str | None = None
    distinct = 0
    for kind, value in segments:
        if kind == "static":
            tokens = count_tokens(str(value))
            if first is None:
                before += tokens
            else:
                after += tokens
            continue
        if first is not None:
            continue
        for name in sorted(value):
            column = (aliases or {}).get(name, name)
            values = {repr(r.get(column)) for r in rows}
            if len(values) > max(8, len(rows) // 10):  # varies per row, not a handful of categories
                first, distinct = name, len(values)
                break
    if first is None or after < block_size or after < before:
        return None
    shown = f"{{{{ {first} }}}}"
    message = (
        f"the template puts {shown} ({distinct} distinct values in the sample) before {after} tokens "
        f"of static text; every row's prompt differs from there on, so that text is computed for "
        f"every row. Put the static text first and {shown} last to share it."
    )
    return OrderFlag(first, after, before, distinct, message)


def check_column(
    column: str, values: Sequence[str], count_tokens: Callable[[str], int], block_size: int
) -> OrderFlag | None:
    """For a verbatim prompt column: a flag when the values share a long ending but a short beginning."""
    texts = [v for v in values if isinstance(v, str) and v]
    if len(texts) < 2:
        return None
    head = count_tokens(os.path.commonprefix(texts)) if texts else 0
    tail = count_tokens(os.path.commonprefix([t[::-1] for t in texts])[::-1])
    if tail < block_size or tail < 2 * head:
        return None
    message = (
        f"every sampled value of column {column!r} ends with the same ~{tail} tokens but starts with "
        f"only ~{head} shared tokens; the prefix cache shares only beginnings, so build the prompt "
        f"with the shared text first (a template: static text, then the row's text)."
    )
    return OrderFlag(column, tail, head, len(set(texts)), message)

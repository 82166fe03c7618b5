"""Reference prompts for label calibration: what the job's prompt looks like when the row says nothing.

``contextual``: the job's own template with every row value replaced by a content-free input ("N/A"
and "[MASK]" by default), so the instructions and the listed labels stay and only the content goes.
``domain``: the text that introduces the answer (the template's text after its last expression,
e.g. "Category:"), alone. They share the job's prefix, so the prefix cache serves most of them.
"""

from __future__ import annotations

import re

from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.job.config import JobConfig
from prefixflow.pipeline.prompts.render import template_columns
from prefixflow.pipeline.prompts.sandbox import compile_template

_LAST_TAG = re.compile(r"(\}\}|%\})(?![\s\S]*(\}\}|%\}))")


def template_suffix(template: str) -> str:
    """The literal text after the template's last expression or tag."""
    m = _LAST_TAG.search(template)
    return template[m.end() :] if m else template


def content_free_text(template: str | None, value: str) -> str:
    """The job's prompt text with every row value replaced by ``value`` (raises on a template error)."""
    if template is None:
        return value
    names = template_columns(template)
    return compile_template(template).render(**{name: value for name in names})


def reference_texts(cfg: JobConfig, template: str | None) -> tuple[list[str], list[str]]:
    """(texts, problems): the user texts to score labels on (a label job in score mode, rendered with
    ``template``), before chat wrapping, and why any of the configured references could not be rendered."""
    label = cfg.label
    if label.calibration == "none":
        return [], []
    if label.calibration == "domain":
        return [domain_premise(template)], []
    texts, problems = [], []
    for value in label.content_free:
        try:
            texts.append(content_free_text(template, value))
        except Exception as exc:  # the template rejects this stand-in (a filter expecting a number, ...)
            problems.append(f"{value!r}: {type(exc).__name__}: {exc}")
    return texts, problems


def domain_premise(template: str | None) -> str:
    return template_suffix(template).lstrip() if template else ""


def check_references(cfg: JobConfig, template: str | None) -> None:
    """Fail at load when calibration could not build a single reference prompt for this (score mode)
    label job, whose rows are rendered with ``template``."""
    if cfg.label.calibration == "domain" and not domain_premise(template).strip() and cfg.chat == "off":
        raise JobConfigError(
            "job config: label.calibration: domain scores each label after the text that introduces "
            "the answer (the template's text after its last {{ }}, e.g. '...\\nCategory:'), and this job's "
            "template ends with an expression; end the template with such text, or use contextual"
        )
    texts, problems = reference_texts(cfg, template)
    if cfg.label.calibration in ("contextual", "batch+contextual") and not texts:
        raise JobConfigError(
            "job config: label.content_free: the template fails on every content-free input ("
            + "; ".join(problems)
            + "); list inputs it accepts, or set label.calibration: none"
        )

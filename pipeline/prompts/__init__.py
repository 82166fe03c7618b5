"""Rendering a row's prompt: the sandboxed Jinja2 renderer, its limits and its rules for null and
blank cells."""

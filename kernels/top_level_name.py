"""Hands the top-level name ``kernels`` to the installed PyPI package when a checkout's folder took it.

The layers live in top-level folders and install as ``prefixflow.kernels`` etc., so an installed
prefixflow never claims ``kernels``. But with a checkout's root on ``sys.path`` (pytest's rootdir insertion,
``python -m``, ``PYTHONPATH=.``), ``import kernels`` finds this folder first, and transformers >= 5.25 (which
depends on the PyPI ``kernels`` package and imports it at start-up) fails on names this folder lacks.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from types import ModuleType

_CHECKOUT_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def _outside_checkout(path: list[str]) -> list[str]:
    return [p for p in path if os.path.realpath(p or os.getcwd()) != _CHECKOUT_ROOT]


def hand_over_top_level_name(modules: dict[str, ModuleType], path: list[str] | None = None) -> bool:
    """Load the installed ``kernels`` package into ``modules["kernels"]``; False when none is installed.

    Called while this folder is being imported as ``kernels``: the import system returns whatever
    ``sys.modules["kernels"]`` holds once the folder's ``__init__`` finishes, so the caller gets the real package.
    """
    import sys

    spec = importlib.machinery.PathFinder.find_spec("kernels", _outside_checkout(path or sys.path))
    if spec is None or spec.loader is None:
        return False
    module = importlib.util.module_from_spec(spec)
    modules["kernels"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del modules["kernels"]
        raise
    return True

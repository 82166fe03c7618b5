"""No test module or conftest switches Triton's interpreter on for the whole run (issue 11, item 7):
collecting the suite must leave TRITON_INTERPRET as it found it, so later tests and every subprocess
see the caller's environment. Tests that need the interpreter take the ``triton_interpreter`` fixture."""

from __future__ import annotations

import os

from tests.conftest import TRITON_INTERPRET_AT_START


def test_collection_and_earlier_tests_left_triton_interpret_alone() -> None:
    assert os.environ.get("TRITON_INTERPRET") == TRITON_INTERPRET_AT_START


def test_the_fixture_sets_it_for_one_test_only(triton_interpreter: None) -> None:
    import torch

    if not torch.cuda.is_available():
        assert os.environ.get("TRITON_INTERPRET") == "1"

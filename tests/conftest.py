"""Suite-wide settings.

One intra-op thread per test process: the models in tests are tiny, and on a 2-core CI machine
OpenMP threads spinning against subprocesses (kill tests, Prefect, Ray) slow everything down by an
order of magnitude. Subprocesses inherit OMP_NUM_THREADS.

Triton's interpreter is switched on per test (``triton_interpreter``), never for the whole run: an
environment variable set at collection would reach every later test and every subprocess.
"""

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

TRITON_INTERPRET_AT_START = os.environ.get("TRITON_INTERPRET")


@pytest.fixture
def triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run this test's Triton kernels under the interpreter when there is no CUDA device.

    Triton reads TRITON_INTERPRET when a function is decorated (its own standard library at
    ``import triton``, our kernels at the first import of a ``kernels.triton_*`` module) and again when
    a kernel is launched. On a CPU machine only tests using this fixture import triton, so setting the
    variable for the test's duration covers both, and it is undone after the test.
    """
    if torch.cuda.is_available():
        return
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if "triton" in sys.modules:
        import triton.language as tl

        if type(tl.standard.sum).__name__ != "InterpretedFunction":
            pytest.fail(
                "triton was imported before this test outside the triton_interpreter fixture, so its "
                "functions compile instead of interpreting; import triton only in tests using the fixture"
            )

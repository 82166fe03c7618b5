"""Suite-wide settings.

One intra-op thread per test process: the models in tests are tiny, and on a 2-core CI machine
OpenMP threads spinning against subprocesses (kill tests, Prefect, Ray) slow everything down by an
order of magnitude. Subprocesses inherit OMP_NUM_THREADS.

Triton's interpreter is switched on per test (``triton_interpreter``), never for the whole run: an
environment variable set at collection would reach every later test and every subprocess.
"""

import importlib.util
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

TRITON_INTERPRET_AT_START = os.environ.get("TRITON_INTERPRET")


def _import_triton_interpreted() -> None:
    """On a machine without CUDA, Triton can only run interpreted, and it decides that when it decorates
    a function: its own standard library (``tl.sum``, ...) as soon as anything imports triton, which
    transformers' model code does through torch._dynamo. So triton is imported here, once, with the
    variable set, and the variable is removed again at once: no test and no subprocess sees it."""
    if torch.cuda.is_available() or importlib.util.find_spec("triton") is None or "triton" in sys.modules:
        return
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    finally:
        if TRITON_INTERPRET_AT_START is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = TRITON_INTERPRET_AT_START


_import_triton_interpreted()


@pytest.fixture
def triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run this test's Triton kernels under the interpreter when there is no CUDA device.

    Triton reads TRITON_INTERPRET when a function is decorated (our kernels at the first import of a
    ``kernels.triton_*`` module, which on a CPU machine only tests using this fixture do) and again when
    a kernel is launched; setting it for the test's duration covers both, and it is undone after.
    """
    if torch.cuda.is_available():
        return
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if "triton" in sys.modules:
        import triton.language as tl

        if type(tl.standard.sum).__name__ != "InterpretedFunction":
            pytest.fail(
                "triton was imported without TRITON_INTERPRET before tests/conftest.py could import it "
                "interpreted, so its functions compile instead of interpreting on this CPU-only machine"
            )


S3_TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on a free loopback port, reached over HTTP (one for the whole session)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _s3_test_credentials(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Dummy credentials for each test that uses the S3 endpoint, set per test through monkeypatch.
    Setting them once for the session broke every later S3 test as soon as one test that monkeypatches
    the AWS variables itself (to remove them) happened to start the session server: its teardown
    restored "no credentials" for the rest of the session."""
    if "s3_endpoint" not in request.fixturenames:
        yield
        return
    import s3fs

    for name, value in S3_TEST_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    yield
    # s3fs caches filesystems by their arguments: one built while a test had other (or no) credentials
    # must not serve the next test
    s3fs.S3FileSystem.clear_instance_cache()


def _tensor_parallel_workers() -> list[int]:
    """Tensor-parallel worker processes this test process started and that are still running."""
    me, found = str(os.getpid()), []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, parent = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if parent == me and state != "Z" and b"prefixflow.engine.distributed.worker import serve" in cmdline:
            found.append(int(entry))
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No test may leave a tensor-parallel worker behind: kill any that remain and fail the run."""
    import gc
    import signal
    import time

    gc.collect()  # an LLM only garbage-collected at the end takes its workers with it
    deadline = time.monotonic() + 10
    while (left := _tensor_parallel_workers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        print(f"\nERROR: tensor-parallel worker processes outlived the tests: {left} (killed now)")
        session.exitstatus = 1

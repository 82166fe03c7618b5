"""Suite-wide settings.

One intra-op thread per test process: the models in tests are tiny, and on a 2-core CI machine
OpenMP threads spinning against subprocesses (kill tests, Prefect, Ray) slow everything down by an
order of magnitude. Subprocesses inherit OMP_NUM_THREADS.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on a free loopback port, reached over HTTP; dummy credentials in the env."""
    from moto.server import ThreadedMotoServer

    saved = {
        k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1"
    )
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


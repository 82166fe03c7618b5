"""Suite-wide settings.

One intra-op thread per test process: the models in tests are tiny, and on a 2-core CI machine
OpenMP threads spinning against subprocesses (kill tests, Prefect, Ray) slow everything down by an
order of magnitude. Subprocesses inherit OMP_NUM_THREADS.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

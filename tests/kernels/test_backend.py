"""Backend selection: auto picks by device, forcing works, and kernels/ imports without triton."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prefixflow import kernels
from prefixflow.kernels import backend, reference

ROOT = Path(__file__).resolve().parents[2]


def test_auto_on_cpu_is_the_torch_reference() -> None:
    from prefixflow.kernels import cpu_native_ops, cpu_row_attention

    ops = kernels.select("auto", "cpu")
    assert ops.name == "torch"
    # one native copy per token where it runs, else the reference (tests/kernels/test_cpu_native_ops.py)
    assert ops.store_kv is cpu_native_ops.store_kv
    # the native row kernel where it runs, else the batched SDPA path; both checked against the reference
    assert ops.paged_attention is cpu_row_attention.paged_attention


def test_env_override_forces_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(backend.BACKEND_ENV, "torch")
    assert kernels.select("auto", "cuda").name == "torch"


def test_forced_triton_on_cpu_under_interpreter() -> None:
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("interpreter check is for CPU-only machines")
    ops = kernels.select("triton", "cpu")
    assert ops.name == "triton"
    x = torch.randn(3, 16)
    assert torch.allclose(ops.silu_and_mul(x), reference.silu_and_mul(x), rtol=1e-5, atol=1e-6)


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown kernel backend"):
        kernels.select("cuda-magic", "cpu")


def run_isolated(code: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env_extra
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_import_without_triton() -> None:
    """A None entry in sys.modules makes `import triton` raise ImportError, as if not installed."""
    code = (
        "import sys, importlib.util\n"
        "sys.modules['triton'] = None\n"
        "importlib.util.find_spec = (lambda f: (lambda n, *a: None if n == 'triton' else f(n, *a)))(importlib.util.find_spec)\n"
        "from prefixflow import kernels\n"
        "assert kernels.select('auto', 'cpu').name == 'torch'\n"
        "try:\n    kernels.select('triton', 'cpu')\nexcept RuntimeError as e:\n    print('refused:', e)\n"
    )
    proc = run_isolated(code, {"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "refused: kernel backend 'triton' requested but triton is not installed" in proc.stdout


def test_forced_triton_on_cpu_without_interpreter_is_refused() -> None:
    pytest.importorskip("triton")
    code = "from prefixflow import kernels\ntry:\n    kernels.select('triton', 'cpu')\nexcept RuntimeError as e:\n    print('refused:', e)\n"
    proc = run_isolated(code, {"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "TRITON_INTERPRET=1" in proc.stdout

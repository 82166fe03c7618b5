"""Every Triton kernel, at the tiles the wrappers launch, compiles for sm_90 without register spills.

Runs tests/kernels/sm90_compile.py in a subprocess (that needs real, not interpreted, kernels);
no GPU needed. Slow (~30 s): deselected by default, run with `-m slow`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("sm90_compile.py")


def test_all_kernels_compile_for_sm90_without_spills() -> None:
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(rows) >= 20
    for row in rows:
        assert "error" not in row, row
        if row["spill_bytes"] is not None:  # None: no ptxas in this triton wheel
            assert row["spill_bytes"] == 0, row

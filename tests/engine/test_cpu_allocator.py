"""engine/cpu_allocator.py: with the tuned glibc thresholds a step-sized buffer comes from the heap and
stays there when freed (no fresh mmap, no page faults at the next step); ``PREFIXFLOW_CPU_MALLOC``
opts out, or fails on a bad value."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from prefixflow.engine import cpu_allocator

# mallinfo2 (glibc >= 2.33): hblkhd = bytes in mmapped blocks, fordblks = free bytes kept in the heap
SCRIPT = """
import ctypes, json, torch
from prefixflow.engine.cpu_allocator import tune_cpu_allocator
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = Info
choice = tune_cpu_allocator()
a = torch.empty(24 << 20, dtype=torch.uint8).fill_(1)  # a bf16 gate|up output of 4,096 x 3,072
mapped = mallinfo2().hblkhd
del a
kept = mallinfo2().fordblks
print(json.dumps({"tuned": choice.tuned, "reason": choice.reason, "mapped": mapped, "kept": kept}))
"""
MIB = 1 << 20


def run(setting: str) -> dict[str, object]:
    env = {**os.environ, cpu_allocator.ENV: setting}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt/mallinfo2 are glibc calls")
def test_tuned_thresholds_keep_a_step_buffer_in_the_heap() -> None:
    tuned, default = run("tuned"), run("default")
    assert tuned["tuned"] is True and "32 MiB" in str(tuned["reason"])
    assert default["tuned"] is False
    # glibc's own: a 24 MiB block is a fresh mmap (unmapped again on free, faulted in again next step)
    assert int(str(default["mapped"])) >= 24 * MIB
    # tuned: the block comes from the heap and its pages stay there, free, for the next step
    assert int(str(tuned["mapped"])) < 24 * MIB
    assert int(str(tuned["kept"])) >= 24 * MIB


def test_a_bad_setting_fails_with_what_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_allocator.ENV, "jemalloc")
    with pytest.raises(ValueError, match="'tuned' or 'default'"):
        cpu_allocator.tune_cpu_allocator.__wrapped__()

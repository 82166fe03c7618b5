"""Build a C kernel of ``kernels/native/`` for this CPU at first use, and load it with ctypes.

Why at first use: ``-march=native`` is what makes the compiler vectorise a kernel for this CPU
(AVX2, AVX-512, ...), and a wheel cannot know the CPU it will run on. The source has no torch
headers, so a build takes about a second, not the minutes of a torch C++ extension. The library is
cached under ``PREFIXFLOW_NATIVE_CACHE`` (default ``~/.cache/prefixflow/native``), keyed by the
source, the compiler's version and flags and the CPU's flags, so another CPU or compiler never
loads a stale build; it is written to a temporary name and renamed, so concurrent processes race
safely. Without a C compiler, or with ``PREFIXFLOW_NATIVE_KERNELS=0``, ``load`` returns None and
callers keep their torch path: a native kernel is never required for correct results.
``PREFIXFLOW_NATIVE_MARCH`` sets another ``-march`` target (``haswell``: an AVX2 build on an AVX-512
CPU, to measure what an AVX2 host would run).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch  # noqa: F401  (loaded first: its libgomp is the one the kernels' OpenMP binds to)

log = logging.getLogger(__name__)

ENABLE_ENV = "PREFIXFLOW_NATIVE_KERNELS"  # "0" keeps every kernel on its torch path
CACHE_ENV = "PREFIXFLOW_NATIVE_CACHE"
SOURCE_DIR = Path(__file__).resolve().parent / "native"
MARCH_ENV = "PREFIXFLOW_NATIVE_MARCH"  # the -march target (default native; e.g. haswell for an AVX2 build)
BASE_FLAGS = ("-O3", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno")


def flags() -> tuple[str, ...]:
    return (f"-march={os.environ.get(MARCH_ENV, 'native').strip() or 'native'}", *BASE_FLAGS)


_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1").strip().lower() not in {"0", "false", "off", "no"}


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "prefixflow" / "native"


def _build(name: str, cc: str) -> Path:
    source = SOURCE_DIR / f"{name}.c"
    text = source.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    key = hashlib.sha256(
        b"\0".join([text, version.encode(), " ".join(flags()).encode(), _cpu_flags().encode()])
    )
    target = _cache_dir() / f"{name}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *flags(), str(source), "-o", tmp], capture_output=True, text=True, check=False
        )
        if done.returncode:
            raise RuntimeError(f"{cc} failed on {source.name}: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load(name: str) -> ctypes.CDLL | None:
    """``kernels/native/<name>.c`` built for this CPU and loaded, or None where it cannot be (no C
    compiler, a failed build, not Linux, or turned off by ``PREFIXFLOW_NATIVE_KERNELS=0``)."""
    if not enabled():
        return None
    with _lock:
        if name in _loaded:
            return _loaded[name]
        lib: ctypes.CDLL | None = None
        cc = _compiler()
        if sys.platform.startswith("linux") and cc is not None:
            try:
                lib = ctypes.CDLL(str(_build(name, cc)))
            except (OSError, RuntimeError) as exc:
                log.warning("native kernel %s unavailable, using the torch path: %s", name, exc)
        _loaded[name] = lib
        return lib

"""The persistent KV tier's files: a whole file or none (also when the writer is SIGKILLed mid-write,
or rewritten while read), every damage a miss that removes the file, and the cap's LRU order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from prefixflow.engine.kv_offload import disk_files

NS, OTHER_NS = b"n" * 16, b"m" * 16
DIGEST = bytes(range(16))


def write(folder, digest: bytes, payload: bytes, namespace: bytes = NS) -> os.PathLike:
    path = disk_files.block_path(folder, digest, 0)
    disk_files.write_block(path, namespace, digest, memoryview(payload))
    return path


def test_a_block_reads_back_whole(tmp_path):
    payload = os.urandom(1000)
    path = write(tmp_path, DIGEST, payload)
    buf, problem = disk_files.read_block(path, NS, DIGEST, len(payload))
    assert problem is None
    assert bytes(buf[disk_files.HEADER.size : disk_files.HEADER.size + len(payload)]) == payload
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda b: b[: len(b) - 7], "bytes, expected"),  # truncated
        (lambda b: b + b"x", "bytes, expected"),  # longer
        (lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:], "checksum mismatch"),  # a flipped payload bit
        (lambda b: b"XXXXXXXX" + b[8:], "not a prefixflow KV block"),
    ],
)
def test_damage_is_a_miss_that_removes_the_file(tmp_path, damage, why):
    path = write(tmp_path, DIGEST, os.urandom(1000))
    path.write_bytes(damage(path.read_bytes()))
    _, problem = disk_files.read_block(path, NS, DIGEST, 1000)
    assert problem is not None and problem.startswith("corrupt") and why in problem
    assert not path.exists()


def test_a_file_of_another_namespace_or_block_is_never_used(tmp_path):
    path = write(tmp_path, DIGEST, os.urandom(1000), namespace=OTHER_NS)  # copied into the wrong folder
    assert "another block" in disk_files.read_block(path, NS, DIGEST, 1000)[1]
    path = write(tmp_path, DIGEST, os.urandom(1000))
    assert "another block" in disk_files.read_block(path, NS, DIGEST[::-1], 1000)[1]
    assert disk_files.read_block(path, NS, DIGEST, 1000)[1] == "missing"


CHILD = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("disk_files", sys.argv[1])
disk_files = importlib.util.module_from_spec(spec); spec.loader.exec_module(disk_files)
def parts():
    yield b"x" * 4096
    print("writing", flush=True)
    while True:
        time.sleep(0.05)
        yield b"y" * 4096
disk_files.write_atomic(disk_files.Path(sys.argv[2]), parts())
"""


def test_sigkill_mid_write_leaves_no_file_that_is_ever_read(tmp_path):
    path = disk_files.block_path(tmp_path, DIGEST, 0)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, disk_files.__file__, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "writing"
        time.sleep(0.2)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    (tmp,) = list(tmp_path.rglob("*.tmp"))  # the killed writer's partial file, under a name nobody reads
    assert tmp.stat().st_size > 4096
    assert not path.exists() and disk_files.read_block(path, NS, DIGEST, 4096)[1] == "missing"
    disk_files.enforce_cap(tmp_path, 1 << 30)
    assert tmp.exists()  # it may still be a live writer's
    old = time.time() - disk_files.STALE_TMP_S - 1
    os.utime(tmp, (old, old))
    disk_files.enforce_cap(tmp_path, 1 << 30)
    assert not tmp.exists()


def test_a_file_rewritten_while_it_is_read_is_never_torn(tmp_path):
    payloads = [bytes([i]) * 200_000 for i in range(4)]
    path = write(tmp_path, DIGEST, payloads[0])
    stop = threading.Event()

    def rewrite() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            write(tmp_path, DIGEST, payloads[i % 4])

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        seen = set()
        for _ in range(300):
            buf, problem = disk_files.read_block(path, NS, DIGEST, 200_000)
            assert problem is None  # the rename replaces the file in one step: never missing, never torn
            body = bytes(buf[disk_files.HEADER.size : disk_files.HEADER.size + 200_000])
            assert body in payloads
            seen.add(body[0])
    finally:
        stop.set()
        writer.join()
    assert seen


def test_the_cap_evicts_least_recently_used_across_namespaces(tmp_path):
    paths = []
    for i in range(10):
        folder = tmp_path / ("a" if i % 2 else "b")
        paths.append(write(folder, bytes([i]) * 16, os.urandom(1000)))
        t = 1_000_000 + i
        os.utime(paths[-1], (t, t))
    size = paths[0].stat().st_size
    disk_files.read_block(paths[0], NS, bytes([0]) * 16, 1000)  # a read makes the oldest the newest
    left = disk_files.enforce_cap(tmp_path, 5 * size)
    kept = [i for i, p in enumerate(paths) if p.exists()]
    assert left == len(kept) * size <= 5 * size * disk_files.EVICT_TO
    assert kept == [0, 7, 8, 9]  # down to 90 % of the cap: four files, the re-read one among them
    assert disk_files.directory_bytes(tmp_path) == left

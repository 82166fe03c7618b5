"""The output lease protocol (pipeline/run/lease.py) on a local folder and on S3 (moto's server)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import s3fs

from prefixflow.pipeline import OutputBusy
from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.run.layout import Layout
from prefixflow.pipeline.run.lease import MACHINE, OutputLease
from prefixflow.pipeline.storage.store import Store


def _check_protocol(layout: Layout) -> None:
    writer, replacer = OutputLease(layout), OutputLease(layout)
    writer.acquire_shared()
    with pytest.raises(OutputBusy, match="in use by 1 other run"):
        with replacer.exclusive():
            pass
    writer.release()
    with replacer.exclusive():  # alone now
        late = OutputLease(layout)
        with pytest.raises(OutputBusy, match="a --new-run is replacing"):
            late.acquire_shared()
    late.acquire_shared()  # the exclusive hold is over
    late.release()
    replacer.release()
    assert not layout.store.list_files(layout.leases)


def test_shared_and_exclusive_leases_on_a_local_folder(tmp_path: Path) -> None:
    _check_protocol(Layout(Store.open(str(tmp_path / "out"), StorageConfig())))


def test_shared_and_exclusive_leases_on_s3(s3_endpoint: str) -> None:
    bucket = f"leases-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}).mkdir(bucket)
    _check_protocol(Layout(Store.open(f"s3://{bucket}/out", StorageConfig(endpoint_url=s3_endpoint))))


def _plant(layout: Layout, name: str, **fields: object) -> None:
    lease = {"holder": name, "mode": "shared", "machine": MACHINE, "host": "h", "pid": 1, "renewed_at": time.time(),
             "ttl_s": 60.0, "command": "prefixflow run"} | fields  # fmt: skip
    layout.store.write_atomic(layout.path("_leases", f"{name}.json"), json.dumps(lease).encode())


def test_dead_and_expired_leases_do_not_block_but_live_ones_elsewhere_do(tmp_path: Path) -> None:
    layout = Layout(Store.open(str(tmp_path / "out"), StorageConfig()))
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _plant(layout, "killed-here", pid=int(exited.stdout))  # this machine, process gone: dead at once
    _plant(layout, "expired-elsewhere", machine="other-host/x/y", renewed_at=time.time() - 300)
    replacer = OutputLease(layout)
    with replacer.exclusive():
        pass
    replacer.release()
    assert sorted(p.rsplit("/", 1)[-1] for p in layout.store.list_files(layout.leases)) == []  # dead ones removed
    _plant(layout, "live-elsewhere", machine="other-host/x/y", host="gpu-7", pid=4242)
    with pytest.raises(OutputBusy, match="pid 4242 on gpu-7"):
        with OutputLease(layout).exclusive():
            pass

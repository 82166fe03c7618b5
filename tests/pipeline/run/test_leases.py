"""The output lease protocol (pipeline/run/lease.py) on a local folder and on S3 (moto's server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import s3fs

from prefixflow.pipeline import OutputBusy
from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.run.lease import MACHINE, OutputLease, hold
from prefixflow.pipeline.storage.layout import Layout
from prefixflow.pipeline.storage.store import Store
from tests.pipeline.support import cli_args, job, start_cli, wait_for_hook, write_dataset, write_job


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


def _plant(layout: Layout, name: str, age_s: float = 0.0, **fields: object) -> None:
    """A lease of another holder; ``age_s``: how long ago the storage last wrote it (local folders only)."""
    lease = {
        "holder": name,
        "mode": "shared",
        "machine": MACHINE,
        "host": "h",
        "pid": 1,
        "renewed_at": time.time(),
        "ttl_s": 60.0,
        "command": "prefixflow run",
    } | fields
    path = layout.path("_leases", f"{name}.json")
    layout.store.write_atomic(path, json.dumps(lease).encode())
    if age_s:
        os.utime(path, (time.time() - age_s, time.time() - age_s))


def test_dead_and_expired_leases_do_not_block_but_live_ones_elsewhere_do(tmp_path: Path) -> None:
    layout = Layout(Store.open(str(tmp_path / "out"), StorageConfig()))
    exited = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    _plant(layout, "killed-here", pid=int(exited.stdout))  # this machine, process gone: dead at once
    _plant(layout, "expired-elsewhere", age_s=300, machine="other-host/x/y", renewed_at=time.time() - 300)
    replacer = OutputLease(layout)
    with replacer.exclusive():
        pass
    replacer.release()
    assert (
        sorted(p.rsplit("/", 1)[-1] for p in layout.store.list_files(layout.leases)) == []
    )  # dead ones removed
    _plant(layout, "live-elsewhere", machine="other-host/x/y", host="gpu-7", pid=4242)
    with pytest.raises(OutputBusy, match="pid 4242 on gpu-7"):
        with OutputLease(layout).exclusive():
            pass


def test_one_driver_per_output_lanes_share_and_a_dead_driver_is_handed_on(tmp_path: Path) -> None:
    """Issue 25: shared leases let two runs of one job write one output at once. A run's driver lease refuses
    a second driver (naming it), not the lanes of other processes; a dead driver is reported, not obeyed."""
    layout = Layout(Store.open(str(tmp_path / "out"), StorageConfig()))
    first = OutputLease(layout)
    first.driver, first.ref = "flow run 'calm-fox'", "prefect-flow-run:1"
    first.acquire_shared()
    lane = OutputLease(layout)  # a Ray lane of that run, in another process
    lane.acquire_shared()
    second = OutputLease(layout)
    second.acquire_shared()
    with pytest.raises(
        OutputBusy, match=r"already being written by another run.*driving flow run 'calm-fox'.*wait"
    ):
        second.drive("flow run 'late-owl'")
    assert json.loads(layout.store.read_bytes(second.path))["driver"] == ""  # backed off
    first.release()
    lane.release()
    second.release()
    exited = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    _plant(
        layout,
        "killed-driver",
        pid=int(exited.stdout),
        driver="flow run 'calm-fox'",
        ref="prefect-flow-run:1",
    )
    with hold(layout, driver="flow run 'late-owl'") as held:
        assert [d.ref for d in held.dead_drivers] == ["prefect-flow-run:1"]
        with hold(layout):  # a lane thread of this process shares the driver's lease
            pass
        with pytest.raises(OutputBusy, match="driving flow run 'late-owl'"):
            with hold(layout, driver="another run in this process"):
                pass
    assert not layout.store.list_files(layout.leases)
    with hold(layout) as lane_still_running:  # e.g. a timed-out lane thread outlives its flow run
        with hold(layout, driver="flow run 'one'"):
            pass
        assert lane_still_running.driver == ""
        with hold(layout, driver="flow run 'two'"):  # the next run of this process is not refused
            pass


@pytest.mark.slow  # two CLI processes with the tiny engine: over a minute on a loaded 2-core host
def test_a_second_cli_run_of_the_job_into_one_output_is_refused(tmp_path: Path) -> None:
    """Two real `prefixflow run` processes of one job into one output: the second exits 2 naming the first."""
    write_dataset(tmp_path / "in", files=1, rows_per_file=6, row_group_size=3)
    job_file = write_job(
        tmp_path / "job.yaml", job("generate", sampling={"max_tokens": 2}, output={"shard_rows": 3})
    )
    first = start_cli(
        cli_args(tmp_path / "in", tmp_path / "out", job_file), hooks="commit_end", hook_sleep=60
    )
    try:
        wait_for_hook(first, "commit_end")
        second = start_cli(cli_args(tmp_path / "in", tmp_path / "out", job_file))
        _, err = second.communicate(timeout=240)
        assert second.returncode == 2, err
        assert "already being written by another run" in err and f"pid {first.pid}" in err
        assert "driving prefixflow run" in err and "Traceback" not in err
    finally:
        first.kill()
        first.communicate()


def test_a_writer_clock_ahead_does_not_keep_its_dead_lease_alive(tmp_path: Path) -> None:
    """Issue 23 item 6: liveness is judged by the storage's timestamps, not by the writer's clock. A holder
    on a machine whose clock runs an hour ahead stopped renewing 5 minutes ago: its lease is dead."""
    layout = Layout(Store.open(str(tmp_path / "out"), StorageConfig()))
    _plant(layout, "fast-clock", age_s=300, machine="other-host/x/y", renewed_at=time.time() + 3600)
    replacer = OutputLease(layout)
    with replacer.exclusive():  # the writer's clock said "renewed in an hour": it used to block for an hour
        pass
    replacer.release()


def _slow_clock_lease_blocks(layout: Layout) -> None:
    # a live holder on a machine whose clock runs an hour behind: it has just renewed (the storage says so)
    _plant(
        layout, "slow-clock", machine="other-host/x/y", host="gpu-3", pid=77, renewed_at=time.time() - 3600
    )
    with pytest.raises(
        OutputBusy, match=r"pid 77 on gpu-3 \(prefixflow run\), renewed [01]s ago"
    ):  # it used to count as expired
        with OutputLease(layout).exclusive():
            pass


def test_a_writer_clock_behind_does_not_make_its_live_lease_look_dead(tmp_path: Path) -> None:
    _slow_clock_lease_blocks(Layout(Store.open(str(tmp_path / "out"), StorageConfig())))


def test_a_writer_clock_behind_does_not_make_its_live_lease_look_dead_on_s3(s3_endpoint: str) -> None:
    bucket = f"leases-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}).mkdir(bucket)
    _slow_clock_lease_blocks(
        Layout(Store.open(f"s3://{bucket}/out", StorageConfig(endpoint_url=s3_endpoint)))
    )

"""The flow on a real two-node Ray cluster (tests/flows/ray_cluster.py): lanes spread over the nodes,
a node killed mid-shard, the head restarted between runs, and a cluster that is not there at all."""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.flows.ray_cluster import LocalRayCluster, free_port, wait_for_log
from tests.flows.support import (
    JOB,
    NUM_SHARDS,
    SHARD_ROWS,
    assert_exactly_once,
    read_lane_runs,
    requires_pipeline,
)

pytestmark = [requires_pipeline]
HEAD_IP, NODE_IP = "127.0.0.2", "127.0.0.3"
# Only the second node pauses at the shard hook points, so its lane is still mid-shard when it is killed.
SLOW_NODE = {"PREFIXFLOW_TEST_HOOKS": "commit_end,flush_begin", "PREFIXFLOW_TEST_HOOK_SLEEP": "0.3"}
COMPARED = ["id", "output", "finish_reason", "error_class", "prompt_tokens", "output_tokens", "row_index"]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalRayCluster]:
    pytest.importorskip("ray")
    pytest.importorskip("prefect_ray")
    # the fault drill's marker exists (disarmed) unless a test removes it
    fault = tmp_path / "fault-once"
    fault.write_text("disarmed\n")
    root = Path(tempfile.mkdtemp(prefix="pfray-", dir="/tmp"))
    c = LocalRayCluster(root, env={"PREFIXFLOW_FAULT_ONCE": str(fault)})
    try:
        c.start(workers=1, node_env=SLOW_NODE)
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def _run(cluster: LocalRayCluster, inp: Path, out: Path, **kw: Any) -> Any:
    from prefixflow.flows import batch_inference

    params: dict[str, Any] = dict(
        input=str(inp),
        output=str(out),
        model="tiny",
        job=JOB,
        shard_rows=SHARD_ROWS,
        ray_address=cluster.address,
        lane_resources={"lane": 1},
        retry_delay_s=0.0,
        progress_poll_s=0.5,
        return_state=True,
    )
    params.update(kw)
    return batch_inference(**params)


def _rows(out: Path) -> pa.Table:
    from tests.flows.support import committed_table

    return committed_table(out).select(COMPARED).sort_by("id")


def _markers(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((out / "_commits").rglob("*.json"))}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lanes_spread_over_two_nodes_identical_to_local(
    prefect_server: str, cluster: LocalRayCluster, dataset: tuple[Path, list[str]], tmp_path: Path
):
    from prefixflow.flows import batch_inference

    inp, ids = dataset
    state = _run(cluster, inp, tmp_path / "ray-out")
    assert state.is_completed(), state.message
    result = state.result()
    assert_exactly_once(tmp_path / "ray-out", ids)
    assert result["complete"] is True and result["run_shards_generated"] == NUM_SHARDS
    # one lane per node: the `lane` resource allows no other placement
    assert sorted(lane["node_ip"] for lane in result["lanes"]) == [HEAD_IP, NODE_IP]
    assert len(result["run_nodes"]) == 2 and result["run_lane_resubmits"] == []
    lanes = asyncio.run(read_lane_runs(state.state_details.flow_run_id))
    assert [r.name for r in lanes] == ["lane-0", "lane-1"]

    local = batch_inference(
        input=str(inp),
        output=str(tmp_path / "local-out"),
        model="tiny",
        job=JOB,
        shard_rows=SHARD_ROWS,
        lanes=2,
        concurrency_limit=None,
        progress_poll_s=0.5,
    )
    assert local["complete"] is True
    assert _rows(tmp_path / "ray-out").equals(_rows(tmp_path / "local-out"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_node_killed_mid_shard_lane_resubmitted_on_survivor(
    prefect_server: str, cluster: LocalRayCluster, dataset: tuple[Path, list[str]], tmp_path: Path
):
    import threading

    inp, ids = dataset
    out = tmp_path / "out"
    slow = cluster.nodes[1]
    seen: dict[str, Any] = {}

    def kill_mid_shard() -> None:
        # the slow node's lane committed a shard, then flushed a part of its next one: kill it there
        seen["log"] = wait_for_log(
            slow.worker_logs, ["HOOK commit_end", "HOOK flush_begin", "HOOK flush_begin"], timeout_s=240
        )
        seen["markers"] = _markers(out)
        seen["killed"] = slow.kill(signal.SIGKILL)

    killer = threading.Thread(target=kill_mid_shard, daemon=True)
    killer.start()
    state = _run(cluster, inp, out, flush_rows=1)
    killer.join(timeout=5)
    assert seen.get("killed"), "the slow node was never killed"
    assert state.is_completed(), state.message
    result = state.result()
    assert_exactly_once(out, ids)
    assert result["complete"] is True
    # the killed attempt is in the summary, and its lane finished on the head node
    [resubmit] = result["run_lane_resubmits"]
    assert resubmit["attempt"] == 1 and NODE_IP in resubmit["error"], resubmit
    lane = next(row for row in result["lanes"] if row["lane"] == resubmit["lane"])
    assert lane["attempt"] == 2 and lane["node_ip"] == HEAD_IP
    # shards committed before the kill were neither regenerated nor re-committed
    before = seen["markers"]
    skipped = {f"{s}.json" for s in lane["already_committed"]}
    assert skipped and skipped <= set(before), (skipped, sorted(before))
    after = _markers(out)
    assert {name: after[name] for name in before} == before
    assert not {f"{s}.json" for s in lane["generated"]} & set(before)
    # every shard generated once: the dead attempt's committed shards are counted by no surviving attempt
    assert result["run_shards_generated"] == NUM_SHARDS - len(lane["already_committed"])
    runs = asyncio.run(read_lane_runs(state.state_details.flow_run_id))
    by_name = {r.name: r for r in runs}
    assert by_name[f"lane-{resubmit['lane']}"].state.is_crashed()
    assert by_name[f"lane-{resubmit['lane']}-attempt-2"].state.is_completed()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_head_restart_between_runs_resumes(
    prefect_server: str, cluster: LocalRayCluster, dataset: tuple[Path, list[str]], tmp_path: Path
):
    inp, ids = dataset
    out = tmp_path / "out"
    Path(cluster.env["PREFIXFLOW_FAULT_ONCE"]).unlink()  # arm the drill: one lane fails after a commit
    first = _run(cluster, inp, out, lane_retries=0)
    assert first.is_failed()
    committed = _markers(out)
    assert 0 < len(committed) < NUM_SHARDS

    cluster.stop()  # the head and the node go away; a new cluster (new GCS, new session) comes up
    cluster.start(workers=1)
    second = _run(cluster, inp, out)
    assert second.is_completed(), second.message
    result = second.result()
    assert_exactly_once(out, ids)
    assert result["run_shards_generated"] == NUM_SHARDS - len(committed)
    skipped = {s for lane in result["lanes"] for s in lane["already_committed"]}
    assert {f"{s}.json" for s in skipped} == set(committed)
    after = _markers(out)
    assert {name: after[name] for name in committed} == committed


def test_unreachable_cluster_is_one_clear_line(
    prefect_server: str, dataset: tuple[Path, list[str]], tmp_path: Path
):
    from prefixflow.flows import batch_inference

    inp, _ = dataset
    address = f"127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens there
    state = batch_inference(
        input=str(inp),
        output=str(tmp_path / "out"),
        model="tiny",
        job=JOB,
        ray_address=address,
        return_state=True,
    )
    assert state.is_failed()
    message = str(state.message)
    assert f"Ray cluster at {address} is unreachable" in message and "ray start --head" in message
    with pytest.raises(Exception) as err:
        state.result()
    assert "\n" not in str(err.value) and type(err.value).__name__ == "RayUnreachable"
    assert not (tmp_path / "out").exists()  # nothing planned, nothing written

"""Local device discovery, grouping and limit names (no Prefect server needed)."""

from __future__ import annotations

import pytest

from prefixflow.flows.devices import DeviceGroup, device_groups, gpu_ids


@pytest.mark.parametrize(
    ("env", "ids"),
    [
        ("0,1", ["0", "1"]),
        (" 2 , 3 ", ["2", "3"]),
        ("", []),
        ("-1", []),
        ("1,-1,2", ["1"]),  # CUDA ignores everything from the first invalid entry on
        ("GPU-8a1b,GPU-77ff", ["GPU-8a1b", "GPU-77ff"]),
    ],
)
def test_gpu_ids_follow_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch, env: str, ids: list[str]):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    assert gpu_ids() == ids


def test_cpu_is_one_device_with_one_limit():
    (group,) = device_groups(0, ["0", "1"])
    assert group.is_cpu and group.ordinals == ()
    assert group.limit_names("prefixflow") == ["prefixflow-cpu"]
    assert device_groups(0, []) == [group]


def test_gpu_groups_are_disjoint_and_named_by_physical_id():
    # A flow that sees physical GPUs 4..7 as ordinals 0..3 names them by their physical ids.
    groups = device_groups(1, ["4", "5", "6", "7"])
    assert [g.ordinals for g in groups] == [(0,), (1,), (2,), (3,)]
    assert [g.limit_names("pf") for g in groups] == [["pf-gpu-4"], ["pf-gpu-5"], ["pf-gpu-6"], ["pf-gpu-7"]]
    pairs = device_groups(2, ["0", "1", "2", "3", "4"])  # the fifth GPU is left over
    assert [g.ordinals for g in pairs] == [(0, 1), (2, 3)]
    assert pairs[1].limit_names("pf") == ["pf-gpu-2", "pf-gpu-3"]


def test_odd_ids_make_valid_limit_names():
    group = DeviceGroup(ids=("MIG-GPU-AbC/1/0",), ordinals=(0,))
    assert group.limit_names("pf") == ["pf-gpu-mig-gpu-abc-1-0"]


def test_more_gpus_per_lane_than_visible_is_an_error():
    with pytest.raises(ValueError, match="only 1 GPU"):
        device_groups(2, ["0"])
    with pytest.raises(ValueError, match="no GPU is visible"):
        device_groups(1, [])


def test_a_tensor_parallel_lane_takes_one_gpu_per_rank(monkeypatch: pytest.MonkeyPatch):
    from prefixflow.flows.task_runners import lane_layout

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4")
    layout = lane_layout(None, None, on_ray=False, tensor_parallel_size=2)
    assert (layout.lanes, layout.gpus_per_lane) == (2, 2)  # the fifth GPU cannot host a TP=2 engine
    assert [g.ordinals for g in device_groups(layout.gpus_per_lane, gpu_ids())] == [(0, 1), (2, 3)]
    with pytest.raises(
        ValueError, match="gpus_per_lane=1 but tensor_parallel_size=2: .* set gpus_per_lane to 2"
    ):
        lane_layout(None, 1, on_ray=False, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="only 5 GPU"):
        lane_layout(None, None, on_ray=False, tensor_parallel_size=8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cpu = lane_layout(None, None, on_ray=False, tensor_parallel_size=2)  # CPU ranks (gloo) in one lane
    assert (cpu.lanes, cpu.gpus_per_lane) == (1, 0)


def test_ray_lanes_of_a_tensor_parallel_engine_ask_for_one_gpu_per_rank(monkeypatch: pytest.MonkeyPatch):
    # A Ray cluster with GPUs cannot run here; the cluster's GPU count is the only thing stood in for.
    from prefixflow.flows import task_runners

    monkeypatch.setattr(task_runners, "ray_cluster_gpus", lambda: 8)
    layout = task_runners.lane_layout(None, None, on_ray=True, tensor_parallel_size=4)
    assert (layout.lanes, layout.gpus_per_lane, layout.local) == (2, 4, False)  # num_gpus=4 per Ray task

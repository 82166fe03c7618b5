"""Where lanes run: count local GPUs and build the task runner for a run."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from prefixflow.flows.devices import device_groups, gpu_ids


def visible_gpus() -> int:
    """Number of GPUs this process may use (see `flows.devices.gpu_ids`)."""
    return len(gpu_ids())


def ray_cluster_gpus() -> int:
    """GPUs in the connected Ray cluster (0 if Ray is not initialized)."""
    return int(ray_cluster_resource("GPU"))


def ray_cluster_resource(name: str) -> float:
    """The cluster-wide total of Ray resource `name` (0 if Ray is not initialized)."""
    import ray

    if not ray.is_initialized():
        return 0.0
    return float(ray.cluster_resources().get(name, 0))


class RayUnreachable(RuntimeError):
    """The Ray cluster named by `ray_address` does not answer (one line, what to check)."""


def check_ray_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast with one line when `address` (`host:port` or `ray://host:port`) refuses a TCP
    connection, instead of `ray.init`'s retries and traceback. `auto` is left to Ray."""
    if address == "auto" or address == "local":
        return
    hostport = address.removeprefix("ray://").rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise RayUnreachable(f"ray_address {address!r}: expected host:port, ray://host:port or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RayUnreachable(
            f"Ray cluster at {address} is unreachable ({exc.strerror or type(exc).__name__}); start it "
            "with `ray start --head`, or fix ray_address (host:port of the head's GCS, or ray://host:10001)"
        ) from None


def pin_thread_to_gpu(index: int) -> None:
    """Make `cuda` mean GPU `index` for the calling thread (torch's current device is per thread)."""
    import torch

    torch.cuda.set_device(index)


def make_task_runner(ray_address: str | None, lanes: int) -> TaskRunner:
    """A thread pool with one worker per lane, or a `RayTaskRunner` when `ray_address` is given.

    `ray_address` is a Ray cluster address (`ray://head:10001`, `head:6379`) or `"auto"`
    (the cluster this machine belongs to, or the Ray instance already initialized in-process).
    """
    if not ray_address:
        return ThreadPoolTaskRunner(max_workers=max(1, lanes))
    check_ray_reachable(ray_address)
    from prefect_ray import RayTaskRunner

    return RayTaskRunner(address=ray_address)


@dataclass(frozen=True)
class LaneLayout:
    """How many lanes a run gets and what each holds."""

    lanes: int
    gpus_per_lane: int
    on_ray: bool

    @property
    def local(self) -> bool:
        """Thread lanes choose their devices through the per-device limits; Ray assigns them."""
        return not self.on_ray


def lane_layout(
    lanes: int | None,
    gpus_per_lane: int | None,
    on_ray: bool,
    tensor_parallel_size: int = 1,
    lane_resources: dict[str, float] | None = None,
) -> LaneLayout:
    """Defaults: `tensor_parallel_size` GPUs per lane when GPUs exist (else 0: the CPU) and as many
    lanes as such GPU groups (else 1). A lane whose engine is tensor-parallel must hold one GPU per rank.
    On Ray, `lane_resources` (custom resources each lane asks for, e.g. {"lane": 1}) also bound the
    default lane count: the fewest whole lanes any of them allows across the cluster.

    On Ray this counts the cluster's resources, so call it after the Ray task runner has connected.
    """
    tp = tensor_parallel_size
    gpus_here = ray_cluster_gpus() if on_ray else visible_gpus()
    gpus = (tp if gpus_here else 0) if gpus_per_lane is None else gpus_per_lane
    if gpus < 0:
        raise ValueError(f"gpus_per_lane must be >= 0, got {gpus}")
    if gpus and gpus != tp:
        raise ValueError(
            f"gpus_per_lane={gpus} but tensor_parallel_size={tp}: a lane's engine uses one GPU per "
            f"tensor-parallel rank, so set gpus_per_lane to {tp} (or leave it unset)"
        )
    if not on_ray:
        device_groups(gpus, gpu_ids())  # fails fast when gpus_per_lane exceeds the visible GPUs
    n = lanes if lanes is not None else max(1, gpus_here // max(1, gpus))
    asked = {k: v for k, v in (lane_resources or {}).items() if v > 0}
    if lanes is None and on_ray and asked:
        bound = max(1, min(int(ray_cluster_resource(k) // v) for k, v in asked.items()))
        n = min(n, bound) if gpus else bound
    if n < 1:
        raise ValueError(f"lanes must be >= 1, got {n}")
    return LaneLayout(lanes=n, gpus_per_lane=gpus, on_ray=on_ray)

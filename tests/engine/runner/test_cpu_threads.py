"""The CPU thread default (issue 24): compute threads from the usable cores, a core left for workers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from prefixflow.engine import cpu_threads
from prefixflow.engine.cpu_threads import cgroup_cpu_limit, grammar_threads, set_cpu_threads, thread_plan


@pytest.fixture
def restore_threads() -> Iterator[None]:
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


@pytest.mark.parametrize(
    ("cores", "compute", "workers"), [(1, 1, 0), (2, 1, 1), (4, 3, 1), (8, 7, 1), (16, 14, 2), (64, 56, 8)]
)
def test_the_rule_leaves_cores_for_the_workers(cores: int, compute: int, workers: int) -> None:
    plan = thread_plan(cores=cores)
    assert (plan.cores, plan.compute, plan.workers) == (cores, compute, workers)


def test_a_users_count_is_kept_and_a_bad_one_refused() -> None:
    assert thread_plan(3, cores=2).compute == 3 and thread_plan(3, cores=2).reason == "set by the user"
    with pytest.raises(ValueError, match="at least 1"):
        thread_plan(0, cores=2)


def test_usable_cores_follow_the_affinity_mask_not_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(cpu_threads, "cgroup_cpu_limit", lambda: None)
    assert cpu_threads.usable_cores() == 1 and thread_plan().compute == 1


def test_cgroup_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path) is None  # no cgroup files
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 2  # 1.5 CPUs: rounded up
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cgroup_cpu_limit(v1) == 3
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    assert cgroup_cpu_limit(v1) is None


def test_set_cpu_threads_applies_the_plan(monkeypatch: pytest.MonkeyPatch, restore_threads: None) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 2)
    torch.set_num_threads(2)
    plan = set_cpu_threads()
    assert plan.compute == 1 and torch.get_num_threads() == 1
    assert grammar_threads() == 1  # the core the compute pool left free
    assert set_cpu_threads(2).compute == 2 and torch.get_num_threads() == 2
    assert grammar_threads() == 1  # at least one, even when compute took every core


def test_omp_num_threads_is_kept(monkeypatch: pytest.MonkeyPatch, restore_threads: None) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 4)
    torch.set_num_threads(2)
    plan = set_cpu_threads()
    assert (plan.compute, plan.reason) == (2, "OMP_NUM_THREADS") and torch.get_num_threads() == 2
    assert set_cpu_threads(1).compute == 1 and torch.get_num_threads() == 1  # --threads still wins

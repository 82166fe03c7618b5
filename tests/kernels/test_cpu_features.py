"""The CPU probes follow the ISA limits a user sets on torch (ATen's and oneDNN's), not only the hardware."""

from __future__ import annotations

import pytest
import torch

from prefixflow.kernels import cpu_features


@pytest.fixture
def every_isa(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A CPU that has every probed instruction set, ATen at AVX-512, and no oneDNN limit."""
    for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported", "_is_avx512_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: True, raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    return monkeypatch


def probes() -> tuple[bool, bool, bool]:
    return cpu_features.amx_tiles(), cpu_features.avx512_bf16(), cpu_features.avx512()


def test_no_limit_reports_the_hardware(every_isa: pytest.MonkeyPatch) -> None:
    assert probes() == (True, True, True)
    every_isa.setenv("ONEDNN_MAX_CPU_ISA", "ALL")
    assert probes() == (True, True, True)
    every_isa.setenv("ONEDNN_MAX_CPU_ISA", "not-an-isa")
    assert probes() == (True, True, True)


def test_aten_at_avx2_hides_every_avx512_path(every_isa: pytest.MonkeyPatch) -> None:
    every_isa.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert probes() == (False, False, False)


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        ("avx2", (False, False, False)),
        ("AVX512_CORE", (False, False, True)),
        ("AVX512_CORE_BF16", (False, True, True)),
        ("AVX512_CORE_AMX", (True, True, True)),
    ],
)
def test_onednn_limit_caps_in_order(
    every_isa: pytest.MonkeyPatch, limit: str, expected: tuple[bool, bool, bool]
) -> None:
    every_isa.setenv("ONEDNN_MAX_CPU_ISA", limit)
    assert probes() == expected


def test_the_hardware_still_decides(every_isa: pytest.MonkeyPatch) -> None:
    every_isa.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert probes() == (True, False, True)

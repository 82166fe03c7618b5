"""The advisor's CPU is priced as the engine runs there: the host's class (AMX, AVX512-BF16, or neither,
from /proc/cpuinfo's flags) sets the measured ceilings, and ``dtype: auto`` resolves to the engine's own
choice for the model (bf16 for the embedded GGUF where the CPU multiplies bf16 natively), which picks
the bf16 or the float32 ceiling and efficiency prior. Before, every CPU was the AVX2 host in float32:
on an AMX Xeon a batch-64 run was expected to take 43-62 s and took 7.8 s in bf16."""

from __future__ import annotations

import dataclasses

import pytest

from prefixflow.engine import describe_model
from prefixflow.pipeline import engine_access
from prefixflow.pipeline.advisor.advise import advise
from prefixflow.pipeline.advisor.devices import CPU_CLASSES, cpu_class, cpu_device, cpu_flags
from prefixflow.pipeline.advisor.engine_path import cpu_auto_dtype
from prefixflow.pipeline.advisor.estimate import EFFICIENCY, efficiency_key
from prefixflow.pipeline.job.spec import load_job
from tests.pipeline.advisor.support import unique_texts, write_rows

SMOLLM2 = "smollm2-135m-instruct"
AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"})
ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16"})
ZEN5 = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vp2intersect", "avx_vnni"})
AVX2 = frozenset({"avx2", "fma"})


def test_flags_are_read_from_cpuinfo(tmp_path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 amx_tile amx_bf16\n\nprocessor\t: 1\n"
    )
    assert cpu_flags(str(info)) == frozenset({"fpu", "avx2", "amx_tile", "amx_bf16"})
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


@pytest.mark.parametrize(
    ("flags", "kind"), [(AMX, "amx"), (ZEN5, "zen5"), (ZEN4, "avx512-bf16"), (AVX2, "avx2")]
)
def test_each_class_of_cpu_gets_its_measured_ceilings(flags: frozenset[str], kind: str) -> None:
    assert cpu_class(flags) is CPU_CLASSES[kind]
    device = cpu_device(flags)
    assert device.bytes_per_s == CPU_CLASSES[kind].bytes_per_s and kind in device.source
    fp32 = CPU_CLASSES[kind].flops["fp32"]
    bf16 = dataclasses.replace(device, dtype="bfloat16")
    # a CPU multiplies in the engine's dtype, whatever precision the weights are stored in
    assert device.peak("fp32") == device.peak("int4") == fp32
    want = CPU_CLASSES[kind].flops.get("bf16", fp32)
    assert bf16.peak("bf16") == bf16.peak("int4") == want
    assert efficiency_key(device) == "cpu"
    assert device.cpu_class == kind
    assert efficiency_key(bf16) == {"amx": "cpu-bf16-amx", "avx2": "cpu"}.get(kind, "cpu-bf16")


def test_the_torch_free_dtype_rule_is_the_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_torch(*_args: object, **_kwargs: object) -> dict[str, object]:
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(engine_access, "describe_model", no_torch)
    assert cpu_auto_dtype(SMOLLM2, "gguf-Q4_1", native_bf16=True) == "bfloat16"
    assert cpu_auto_dtype(SMOLLM2, "gguf-Q4_1", native_bf16=False) == "float32"
    assert cpu_auto_dtype(SMOLLM2, "gguf-Q6_K", native_bf16=True) == "float32"
    assert cpu_auto_dtype(SMOLLM2, "bfloat16", native_bf16=True) == "float32"


def test_auto_dtype_prices_the_dtype_the_engine_runs_here(tmp_path) -> None:
    folder = write_rows(tmp_path / "in", [{"id": f"r{i}", "text": t} for i, t in enumerate(unique_texts(12))])

    def priced(**engine: str):  # the dense weights, so that only the dtype differs between the two
        job = {"task": "summarize", "id_column": "id", "sampling": {"max_tokens": 32}, "engine": engine}
        return advise(load_job(folder, "", SMOLLM2, job), gpu="cpu", sample_size=12)

    auto, fp32 = priced(quantization="none"), priced(quantization="none", dtype="float32")
    engine_dtype = describe_model(SMOLLM2, dtype="auto", device="cpu", quantization="none")["dtype"]
    assert auto.device.dtype == engine_dtype and fp32.device.dtype == "float32"
    a, f = auto.estimates[0], fp32.estimates[0]
    assert a.device == f.device == "cpu" and f.precision == "fp32"
    if engine_dtype == "bfloat16":  # a CPU with native bf16: the bf16 ceiling and its measured prior
        assert a.precision == "bf16" and a.efficiency_source == EFFICIENCY[efficiency_key(auto.device)][2]
        ratio = auto.device.flops["bf16"] / auto.device.flops["fp32"]
        assert a.compute_s == pytest.approx(f.compute_s / ratio)
    else:
        assert a.precision == "fp32" and a.compute_s == pytest.approx(f.compute_s)

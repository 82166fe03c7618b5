"""The native row kernel (kernels/cpu_row_attention.py, kernels/native/paged_attention.c): equal to the
reference on NaN-poisoned caches, a row's bits independent of the step, the thread count and the
chunking, bad metadata refused with an error (never a read outside the cache), and the dispatcher
keeping the torch path where the kernel cannot or should not run."""

from __future__ import annotations

import platform

import pytest
import torch

from prefixflow.kernels import cpu_attention, cpu_row_attention, native_build, reference
from tests.kernels.kernel_testlib import build_paged_batch, relative_error, request_alone, step_args

MIXED = [(1, 40), (1, 300), (7, 7), (3, 150), (1, 1), (33, 80), (1, 129), (5, 200)]
TARGET = (33, 80)  # a prefill chunk over a partly cached context

pytestmark = pytest.mark.skipif(
    native_build.load("paged_attention") is None, reason="no C compiler on this machine"
)


@pytest.mark.parametrize(
    ("heads", "block_size", "dtype"),
    [
        ((9, 3, 64), 16, torch.bfloat16),
        ((8, 2, 32), 16, torch.float32),
        ((4, 1, 128), 5, torch.float32),
        ((6, 6, 16), 1, torch.bfloat16),
        ((8, 2, 80), 32, torch.bfloat16),
    ],
    ids=["smollm2-bf16", "gqa", "mqa-odd-blocks", "mha-bf16-block1", "dim80"],
)
def test_rows_equal_the_reference(heads, block_size, dtype):
    hq, hkv, d = heads
    batch = build_paged_batch(
        MIXED, hq, hkv, d, block_size=block_size, dtype=dtype, device=torch.device("cpu")
    )
    want = reference.paged_attention(*step_args(batch), d**-0.5)
    got = cpu_row_attention.paged_attention_rows(*step_args(batch), d**-0.5)
    assert got.dtype == dtype and got.shape == batch.q.shape
    assert not torch.isnan(got).any()
    assert relative_error(got, want) < (1e-2 if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_depend_on_nothing_but_the_row(dtype):
    batch = build_paged_batch(MIXED, 9, 3, 64, block_size=16, dtype=dtype, device=torch.device("cpu"), seed=5)
    b = MIXED.index(TARGET)
    start = int(batch.query_start_loc[b])
    attend = cpu_row_attention.paged_attention_rows
    alone = attend(*request_alone(batch, b, slice(0, 33)), 0.125)
    assert torch.equal(attend(*step_args(batch), 0.125)[start : start + 33], alone)
    chunks = [
        attend(*request_alone(batch, b, slice(lo, hi)), 0.125) for lo, hi in ((0, 20), (20, 32), (32, 33))
    ]
    assert torch.equal(torch.cat(chunks), alone)  # a prompt cut into prefill chunks, then a decode
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert torch.equal(attend(*step_args(batch), 0.125)[start : start + 33], alone)
    finally:
        torch.set_num_threads(threads)


def test_rows_no_request_owns_are_zero():
    batch = build_paged_batch([(2, 20), (1, 9)], 4, 2, 16, block_size=8, device=torch.device("cpu"))
    q = torch.cat([batch.q, torch.randn(3, 4, 16)])  # decode buffers padded past the step's rows
    got = cpu_row_attention.paged_attention_rows(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.query_start_loc, batch.seq_lens, 0.25
    )
    assert torch.equal(got[3:], torch.zeros(3, 4, 16))
    want = reference.paged_attention(*step_args(batch), 0.25)
    assert relative_error(got[:3], want) < 1e-5


def test_bad_metadata_is_an_error_not_a_read_outside_the_cache():
    batch = build_paged_batch([(1, 20), (1, 9)], 4, 2, 16, block_size=8, device=torch.device("cpu"))
    tables = batch.block_tables.clone()
    tables[0, 1] = batch.k_cache.shape[0] + 7
    with pytest.raises(ValueError, match="outside the KV cache"):
        cpu_row_attention.paged_attention_rows(
            batch.q, batch.k_cache, batch.v_cache, tables, batch.query_start_loc, batch.seq_lens, 0.25
        )
    too_long = batch.seq_lens.clone()
    too_long[1] = 8 * batch.block_tables.shape[1] + 1  # more tokens than the table has blocks for
    with pytest.raises(ValueError, match="inconsistent"):
        cpu_row_attention.paged_attention_rows(
            batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.query_start_loc, too_long, 0.25
        )


def test_the_dispatcher_keeps_the_torch_path_where_the_kernel_does_not_fit(monkeypatch):
    calls: list[str] = []
    real = cpu_attention.paged_attention

    def torch_path(*args):
        calls.append("torch")
        return real(*args)

    def took_torch(batch, invariant: bool = False) -> bool:
        """Whether one call went to cpu_attention (checking the result either way)."""
        before = len(calls)
        attend = (
            cpu_row_attention.paged_attention_invariant if invariant else cpu_row_attention.paged_attention
        )
        got = attend(*step_args(batch), 0.25)
        want = reference.paged_attention(*step_args(batch), 0.25)
        assert relative_error(got, want) < (1e-2 if batch.q.dtype != torch.float32 else 1e-5)
        return len(calls) > before

    monkeypatch.setattr(cpu_attention, "paged_attention", torch_path)
    cpu = torch.device("cpu")
    fp16 = build_paged_batch([(1, 20)], 4, 2, 16, block_size=8, dtype=torch.float16, device=cpu)
    odd = build_paged_batch([(1, 20)], 4, 2, 24, block_size=8, device=cpu)
    bf16 = torch.bfloat16
    prefill = build_paged_batch([(40, 40), (1, 9)], 4, 2, 16, block_size=8, dtype=bf16, device=cpu)
    decode = build_paged_batch([(1, 40), (3, 9)], 4, 2, 16, block_size=8, dtype=bf16, device=cpu)
    float32 = build_paged_batch([(1, 40), (3, 9)], 4, 2, 16, block_size=8, device=cpu)
    monkeypatch.setattr(cpu_row_attention, "amx_tiles", lambda: False)
    monkeypatch.setattr(cpu_row_attention, "avx512", lambda: True)
    assert took_torch(fp16) and took_torch(odd)  # no fp16 in the kernel; head_dim not a multiple of 16
    assert not took_torch(prefill)  # a bf16 cache, AVX-512 without AMX tiles: the row kernel for every step
    assert not took_torch(float32)  # a float32 cache too (FLOAT32_ROWS) ...
    monkeypatch.setattr(cpu_row_attention, "FLOAT32_ROWS", False)
    # ... or, off, the torch path unless batch-invariant
    assert took_torch(float32) and not took_torch(float32, invariant=True)
    monkeypatch.setattr(cpu_row_attention, "avx512", lambda: False)
    monkeypatch.setattr(cpu_row_attention, "avx2", lambda: True)
    # AVX2 only: the row kernel for every step, a float32 cache included ...
    assert not took_torch(prefill) and not took_torch(decode) and not took_torch(float32)
    monkeypatch.setattr(cpu_row_attention, "AVX2_ROWS", False)
    assert took_torch(prefill) and took_torch(float32)  # ... or, switched off, the torch path ...
    assert not took_torch(prefill, invariant=True)  # ... where batch-invariant mode keeps the row kernel
    monkeypatch.setattr(cpu_row_attention, "AVX2_ROWS", True)
    monkeypatch.setattr(cpu_row_attention, "avx2", lambda: False)
    assert took_torch(prefill) and took_torch(decode)  # neither AVX-512 nor AVX2: not measured, torch
    monkeypatch.setattr(cpu_row_attention, "avx512", lambda: True)
    monkeypatch.setattr(cpu_row_attention, "amx_tiles", lambda: True)
    assert took_torch(decode)  # AMX tiles: flash SDPA, until the row kernel is measured there
    monkeypatch.setattr(cpu_row_attention, "AMX_ROWS_MAX_QUERY", 16)
    assert took_torch(prefill) and not took_torch(decode)  # a 40-row query stays on SDPA, short ones not
    assert not took_torch(prefill, invariant=True)


def test_the_native_switch_turns_the_kernel_off(monkeypatch, tmp_path):
    monkeypatch.setenv(native_build.ENABLE_ENV, "0")
    monkeypatch.setattr(native_build, "_loaded", {})
    assert native_build.load("paged_attention") is None
    monkeypatch.setenv(native_build.ENABLE_ENV, "1")
    monkeypatch.setenv(native_build.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a compiler that fails: a warning and the torch path, no error
    monkeypatch.setattr(native_build.shutil, "which", lambda name: "/bin/false" if name == "false" else None)
    assert native_build.load("paged_attention") is None
    assert not list(tmp_path.glob("*.so"))


def test_a_build_is_cached_by_source_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv(native_build.CACHE_ENV, str(tmp_path))
    cc = native_build._compiler()
    assert cc is not None
    first = native_build._build("paged_attention", cc)
    stamp = first.stat().st_mtime_ns
    assert native_build._build("paged_attention", cc) == first and first.stat().st_mtime_ns == stamp
    monkeypatch.setattr(native_build, "_cpu_flags", lambda: "flags : another cpu")
    assert native_build._build("paged_attention", cc) != first
    if platform.machine() == "x86_64":
        monkeypatch.setenv(native_build.MARCH_ENV, "x86-64-v3")  # an AVX2 build is another library
        assert "-march=x86-64-v3" in native_build.flags()
        avx2 = native_build._build("paged_attention", cc)
        assert avx2 != first and avx2.exists()


def test_metadata_refilled_in_place_between_steps_is_read_again():
    """Metadata the kernel converts to int32 (anyone's int64) is converted per call: a step that refills
    the same tensors in place (as decode buffers do) must not attend with the last step's lengths."""
    batch = build_paged_batch([(1, 40), (1, 70)], 9, 3, 64, block_size=16, device=torch.device("cpu"))
    args = list(step_args(batch))
    args[3:6] = [t.long() for t in args[3:6]]  # int64 (not the engine's int32): converted per call
    first = cpu_row_attention.paged_attention_rows(*args, 0.125)
    assert torch.equal(cpu_row_attention.paged_attention_rows(*args, 0.125), first)
    seq_lens = args[5]
    seq_lens.sub_(7)  # the next step, shorter contexts, in the same tensor
    want = reference.paged_attention(*args, 0.125)
    got = cpu_row_attention.paged_attention_rows(*args, 0.125)
    assert relative_error(got, want) < 1e-5
    assert not torch.equal(got, first)


def _has_avx2() -> bool:
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return False
    return " avx2" in flags and " fma" in flags


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not _has_avx2(), reason="needs an AVX2 CPU"
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_avx2_build_works_in_8_lanes_and_keeps_the_contract(monkeypatch, tmp_path, dtype):
    """Without AVX-512 the kernel takes 8-lane vectors (another reduction tree than the 16-lane one): built
    here for Haswell, it equals the reference and a row's bits still depend on nothing but the row."""
    monkeypatch.setenv(native_build.MARCH_ENV, "haswell")
    monkeypatch.setenv(native_build.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(native_build, "_loaded", {})
    monkeypatch.setattr(cpu_row_attention, "_fn", None)
    monkeypatch.setattr(cpu_row_attention, "_fn_ready", False)
    attend = cpu_row_attention.paged_attention_rows
    batch = build_paged_batch(MIXED, 9, 3, 64, block_size=16, dtype=dtype, device=torch.device("cpu"), seed=3)
    got = attend(*step_args(batch), 0.125)
    assert list(tmp_path.glob("paged_attention-*.so"))  # this call ran the Haswell build
    want = reference.paged_attention(*step_args(batch), 0.125)
    assert relative_error(got, want) < (1e-2 if dtype == torch.bfloat16 else 1e-5)
    b = MIXED.index(TARGET)
    start = int(batch.query_start_loc[b])
    alone = attend(*request_alone(batch, b, slice(0, 33)), 0.125)
    assert torch.equal(got[start : start + 33], alone)
    chunks = [
        attend(*request_alone(batch, b, slice(lo, hi)), 0.125) for lo, hi in ((0, 20), (20, 32), (32, 33))
    ]
    assert torch.equal(torch.cat(chunks), alone)


def _variant(tmp_path, march: str, *defines: str):
    """The kernel's source built for ``march`` with ``defines``, called as the engine calls it."""
    import ctypes
    import subprocess

    cc = native_build._compiler()
    assert cc is not None
    name = "_".join([march, *defines]) or "plain"
    lib = tmp_path / f"{name}.so"
    subprocess.run(
        [cc, f"-march={march}", *native_build.BASE_FLAGS, *(f"-D{d}" for d in defines),
         str(native_build.SOURCE_DIR / "paged_attention.c"), "-o", str(lib)],
        check=True,
    )  # fmt: skip
    base = cpu_row_attention._function()
    assert base is not None
    fn = ctypes.CDLL(str(lib)).pf_paged_attention
    fn.argtypes, fn.restype = base.argtypes, base.restype
    return fn


@pytest.mark.parametrize("march", ["native", "haswell"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_vector_softmax_and_the_unrolled_chunks_keep_the_scalar_builds_bits(
    monkeypatch, tmp_path, march, dtype
):
    """The softmax's exp runs LANES scores at once and the usual head dims get their chunk loops unrolled:
    both must give every row the bits of the plain build (scalar exp, chunk count read at run time), so
    that a change of build never moves an output. Head dims 64 and 80: one unrolled, one not."""
    if march == "haswell" and (platform.machine() not in ("x86_64", "AMD64") or not _has_avx2()):
        pytest.skip("needs an AVX2 CPU")
    attend = cpu_row_attention.paged_attention_rows
    for d in (64, 80):
        batch = build_paged_batch(
            MIXED, 9, 3, d, block_size=16, dtype=dtype, device=torch.device("cpu"), seed=11
        )
        outs = []
        for defines in ((), ("PF_SCALAR_EXP", "PF_GENERIC_CHUNKS")):
            monkeypatch.setattr(cpu_row_attention, "_fn", _variant(tmp_path, march, *defines))
            outs.append(attend(*step_args(batch), d**-0.5))
        assert torch.equal(outs[0], outs[1])
        want = reference.paged_attention(*step_args(batch), d**-0.5)
        assert relative_error(outs[0], want) < (1e-2 if dtype == torch.bfloat16 else 1e-5)

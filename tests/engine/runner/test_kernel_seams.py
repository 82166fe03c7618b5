"""Kernels reach the layers one way (the selected KernelBackend, no silent fallback), an attention
backend brings its own metadata and decode buffers without edits to the runner, and the option is
named for what it selects (``kernel_backend``; ``attention_backend`` is a deprecated alias)."""

from __future__ import annotations

import collections
import dataclasses
import warnings
from dataclasses import dataclass

import pytest
import torch

from prefixflow import kernels
from prefixflow.engine import LLM, EngineConfig, SamplingParams
from prefixflow.engine.models.norm import RMSNorm
from prefixflow.engine.runner.attention import DecodeBuffers, PagedAttention, PagedDecodeBuffers
from prefixflow.engine.runner.step_inputs import StepInputs
from prefixflow.kernels import KernelBackend
from tests.engine.hf_models import hf_greedy, random_prompts

PARAMS = SamplingParams(max_tokens=5, ignore_eos=True)
KERNELS = ("store_kv", "paged_attention", "rms_norm", "rotary", "silu_and_mul")


def counting_backend(calls: collections.Counter[str]) -> KernelBackend:
    base = kernels.select("torch", "cpu")

    def wrap(name: str):  # type: ignore[no-untyped-def]
        fn = getattr(base, name)

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls[name] += 1
            return fn(*args, **kwargs)

        return counted

    return KernelBackend("counting", *(wrap(n) for n in KERNELS))


def test_every_kernel_call_goes_through_the_selected_backend(llama_dir, monkeypatch):
    calls: collections.Counter[str] = collections.Counter()
    counting = counting_backend(calls)
    monkeypatch.setattr(kernels, "select", lambda name, device: counting)
    llm = LLM(str(llama_dir), dtype="float32", device="cpu")
    assert llm.engine.runner.shard.ops.name == "counting"
    prompts = random_prompts(2, 4, 20, seed=1)
    outs = llm.generate(prompts, PARAMS)
    assert [list(o.token_ids) for o in outs] == hf_greedy(llama_dir, prompts, 5)
    steps = llm.stats().steps
    layers = 2
    assert calls["rms_norm"] == steps * (2 * layers + 1)  # two per layer and the final norm: none bypassed
    assert (
        calls["rotary"]
        == calls["store_kv"]
        == calls["paged_attention"]
        == calls["silu_and_mul"]
        == steps * layers
    )


def test_a_layer_without_kernels_fails_at_construction():
    with pytest.raises(TypeError, match="ops"):
        RMSNorm(8, 1e-6, torch.float32)  # type: ignore[call-arg]


@dataclass(frozen=True)
class RowMetadata:
    """Another backend's own metadata type: the model never looks inside it."""

    paged: object
    rows: int


class RowAttention(PagedAttention):
    """A backend with its own metadata and decode buffers, plugged in without touching the runner."""

    def __init__(self, ops: KernelBackend) -> None:
        super().__init__(ops)
        self.name, self.built, self.buffers = "rows", 0, 0

    def build_metadata(self, step: StepInputs, device: torch.device) -> RowMetadata:
        self.built += 1
        return RowMetadata(super().build_metadata(step, device), len(step.token_ids))

    def make_decode_buffers(
        self, max_batch: int, max_blocks_per_seq: int, device: torch.device
    ) -> DecodeBuffers:
        self.buffers += 1
        inner = PagedDecodeBuffers(max_batch, max_blocks_per_seq, device)

        class RowBuffers(DecodeBuffers):
            def fill(self, step: StepInputs, bucket: int) -> None:
                inner.fill(step, bucket)

            def metadata(self, bucket: int) -> RowMetadata:
                return RowMetadata(inner.metadata(bucket), bucket)

        return RowBuffers()

    def forward(self, q, k, v, k_cache, v_cache, meta, scale):  # type: ignore[no-untyped-def]
        assert isinstance(meta, RowMetadata) and meta.rows == q.shape[0]
        return super().forward(q, k, v, k_cache, v_cache, meta.paged, scale)


def test_an_attention_backend_owns_its_metadata_and_decode_buffers(llama_dir, monkeypatch):
    made: list[RowAttention] = []

    def make(ops: KernelBackend) -> RowAttention:
        made.append(RowAttention(ops))
        return made[-1]

    monkeypatch.setattr("prefixflow.engine.runner.model_shard.make_attention_backend", make)
    llm = LLM(str(llama_dir), dtype="float32", device="cpu", max_num_seqs=4)
    runner = llm.engine.runner
    runner.shard.graphs = runner.shard.make_decode_graphs(
        16, capture=False
    )  # the CUDA-graph path, run eagerly
    prompts = random_prompts(3, 4, 20, seed=2)
    outs = llm.generate(prompts, PARAMS)
    assert [list(o.token_ids) for o in outs] == hf_greedy(llama_dir, prompts, 5)
    (backend,) = made
    assert backend.buffers == 1 and 0 < backend.built < llm.stats().steps  # decode steps used the buffers


def test_attention_backend_is_a_deprecated_alias_of_kernel_backend():
    with pytest.warns(FutureWarning, match="rename it to 'kernel_backend'"):
        cfg = EngineConfig(attention_backend="torch")
    assert cfg.kernel_backend == "torch" and cfg.attention_backend is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dataclasses.replace(cfg).kernel_backend == "torch"  # re-validating does not warn again
    with pytest.raises(ValueError, match="disagree; set only kernel_backend"):
        EngineConfig(attention_backend="torch", kernel_backend="triton")
    with pytest.raises(ValueError, match="kernel_backend='cuda' is invalid"):
        EngineConfig(kernel_backend="cuda")  # type: ignore[arg-type]


def test_a_job_using_the_old_name_fingerprints_like_the_new_one(tmp_path):
    from prefixflow.pipeline.job.spec import parse_job_config

    with pytest.warns(FutureWarning):
        old = parse_job_config({"task": "generate", "engine": {"attention_backend": "torch"}})
    new = parse_job_config({"task": "generate", "engine": {"kernel_backend": "torch"}})
    assert old.engine == new.engine == {"kernel_backend": "torch"}

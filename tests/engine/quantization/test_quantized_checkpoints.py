"""Pre-quantized checkpoints (GPTQ, AWQ, compressed-tensors) load packed and run exactly.

For each format the test packer (tests/engine/quant_packers.py, written from the format descriptions)
writes a tiny random Llama or Qwen2 checkpoint plus a dense twin holding the packer's dequantized
weights. Two checks: every weight the engine unpacks equals the packer's dequantized tensor bit for
bit, and the engine's greedy tokens equal transformers' on the twin (float32; for FP8 W8A8 the twin
also rounds each projection's input to e4m3 per token, as W8A8 does).
"""

from __future__ import annotations

import pytest
import torch

from prefixflow.engine import LLM, SamplingParams
from tests.engine.hf_models import random_prompts
from tests.engine.quant_models import hf_twin_greedy, make_base, unpacked_weights
from tests.engine.quant_packers import Fmt, write_quantized

MAX_NEW = 8

# A default-run cross-section; the full matrix runs under -m slow.
FAST = [
    ("llama", Fmt("gptq", 4, 128, sym=False, act_order=True)),
    ("qwen2", Fmt("gptq", 4, 32, sym=True, v2=True)),
    ("llama", Fmt("gptq", 8, -1, sym=True)),
    ("qwen2", Fmt("awq", 4, 128, sym=False)),
    ("llama", Fmt("ct-int", 4, 128, sym=True)),
    ("qwen2", Fmt("ct-int", 8, -1, sym=True)),
    ("llama", Fmt("ct-fp8", fp8_strategy="channel")),
]
FULL = (
    [  # GPTQ on Llama (v2 with the asymmetric half: zeros are what v1/v2 store differently)
        ("llama", Fmt("gptq", bits, group, sym=sym, act_order=act, v2=not sym))
        for bits in (4, 8)
        for group in (32, 128, -1)
        for sym in (True, False)
        for act in (False, True)
        if not (act and group == -1)
    ]
    + [("qwen2", Fmt("gptq", 4, 32, sym=False, act_order=True)), ("qwen2", Fmt("gptq", 8, -1, sym=False))]
    + [
        (arch, fmt)
        for arch in ("llama", "qwen2")
        for fmt in (
            Fmt("awq", 4, 32, sym=False),
            Fmt("awq", 4, 128, sym=False),
            Fmt("ct-int", 4, 128, sym=False),
            Fmt("ct-int", 4, 32, sym=True, act_order=True),
            Fmt("ct-int", 8, 128, sym=True),
            Fmt("ct-fp8", fp8_strategy="tensor"),
            Fmt("ct-fp8", fp8_strategy="channel"),
        )
    ]
)


@pytest.fixture(scope="module")
def root(quant_root):
    return quant_root


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(4, 3, 40, seed=5)


def _check(root, prompts, arch: str, fmt: Fmt) -> None:
    quant_dir, twin_dir, dense = write_quantized(make_base(root, arch), root, fmt)
    unpacked = unpacked_weights(quant_dir)
    assert sorted(unpacked) == sorted(dense)
    for name, want in dense.items():
        assert torch.equal(unpacked[name], want), name

    llm = LLM(str(quant_dir), dtype="float32", device="cpu")
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))
    got = [list(o.token_ids) for o in outs]
    assert got == hf_twin_greedy(twin_dir, prompts, MAX_NEW, fp8_activations=fmt.kind == "ct-fp8")
    stats = llm.stats()
    assert stats.quantization == {"gptq": "gptq", "awq": "awq"}.get(fmt.kind, "compressed-tensors")
    assert 0 < stats.weight_bytes


@pytest.mark.parametrize(("arch", "fmt"), FAST, ids=[f"{a}-{f.label}" for a, f in FAST])
def test_checkpoint_unpacks_exactly_and_matches_dense_twin(root, prompts, arch, fmt):
    _check(root, prompts, arch, fmt)


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "fmt"), FULL, ids=[f"{a}-{f.label}" for a, f in FULL])
def test_full_format_matrix(root, prompts, arch, fmt):
    _check(root, prompts, arch, fmt)


def test_quantized_checkpoint_holds_less_than_its_dense_twin(root):
    quant_dir, twin_dir, _ = write_quantized(make_base(root, "llama"), root, Fmt("gptq", 4, 128, sym=False))
    packed = LLM(str(quant_dir), dtype="float32", device="cpu", num_kv_blocks=4).stats().weight_bytes
    dense = LLM(str(twin_dir), dtype="float32", device="cpu", num_kv_blocks=4).stats().weight_bytes
    # embeddings and the LM head (dense in both) dominate this tiny model; the projections shrink ~7x
    assert packed < 0.75 * dense, (packed, dense)

"""2:4 sparse checkpoints (compressed-tensors sparse-24-bitmask and dense-stored 2:4, alone and with
FP8 / int4) load and run exactly; a bad mask is a load error naming the tensor; ``sparsity="2:4"``
prunes a dense model by magnitude on the fly.

The checkpoints come from tests/engine/sparse_packers.py (written from the format description); the
oracle is transformers on the dense twin, float32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from prefixflow.engine import LLM, SamplingParams, describe_model
from prefixflow.engine.quantization import CheckpointError, QuantizationError, resolve_quantization
from prefixflow.engine.quantization.sparse24 import decompress_bitmask, prune_24, sparse_kernel
from tests.engine.hf_models import random_prompts
from tests.engine.quant_models import hf_twin_greedy, make_base
from tests.engine.sparse_packers import SparseFmt, pack_bitmask, prune_mask, write_sparse

MAX_NEW = 8
OPTIONS = dict(dtype="float32", device="cpu", num_kv_blocks=64, block_size=8)
GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)

CASES = [
    ("llama", SparseFmt("sparse-24-bitmask")),
    ("qwen2", SparseFmt("dense")),
    ("llama", SparseFmt("sparse-24-bitmask", "fp8")),
    ("qwen2", SparseFmt("dense", "fp8")),
    ("llama", SparseFmt("dense", "int4")),
]


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(3, 3, 40, seed=6)


@pytest.mark.parametrize(("arch", "fmt"), CASES, ids=[f"{a}-{f.label}" for a, f in CASES])
def test_sparse_checkpoint_gives_transformers_tokens_on_its_dense_twin(quant_root, prompts, arch, fmt):
    sparse_dir, twin_dir = write_sparse(make_base(quant_root, arch), quant_root, fmt)
    llm = LLM(str(sparse_dir), **OPTIONS)
    got = [list(o.token_ids) for o in llm.generate(prompts, GREEDY)]
    assert got == hf_twin_greedy(twin_dir, prompts, MAX_NEW, fp8_activations=fmt.quant == "fp8")
    identity = llm.engine.model_identity
    assert identity["quantization"]["sparsity"] == {
        "structure": "2:4",
        "source": f"checkpoint ({fmt.storage})",
        "kernel": "dense",
        "kernel_why": identity["quantization"]["sparsity"]["kernel_why"],
    }
    assert identity == describe_model(str(sparse_dir), dtype="float32", device="cpu") | {
        "model": identity["model"]
    }


def test_decompressed_weights_equal_the_packers(quant_root):
    from safetensors.torch import load_file

    from prefixflow import kernels
    from prefixflow.engine.loading.loader import resolve_model
    from prefixflow.engine.loading.model_config import ModelConfig
    from prefixflow.engine.models.linear import Linear
    from prefixflow.engine.models.llama import LlamaForCausalLM
    from prefixflow.engine.models.weights import load_weights
    from prefixflow.engine.runner.attention import make_attention_backend

    sparse_dir, twin_dir = write_sparse(
        make_base(quant_root, "llama"), quant_root, SparseFmt("sparse-24-bitmask")
    )
    source = resolve_model(sparse_dir)
    ops = kernels.select("torch", torch.device("cpu"))
    quant = resolve_quantization(source.hf_config)
    model = LlamaForCausalLM(
        ModelConfig.from_hf(source.hf_config), torch.float32, ops, make_attention_backend(ops), quant=quant
    )
    load_weights(model, source.weights())
    twin = load_file(str(twin_dir / "model.safetensors"))
    checked = 0
    for module in model.modules():
        if isinstance(module, Linear) and module.method.name == "dense+2:4":
            for prefix, part in zip(module.prefixes, module.weight.split(module.out_sizes)):
                assert torch.equal(part, twin[f"{prefix}.weight"]), prefix
                checked += 1
    assert checked == 7 * 2  # q k v o gate up down, two layers


@pytest.mark.parametrize("storage", ["dense", "sparse-24-bitmask"])
def test_a_third_nonzero_in_a_group_is_a_load_error_naming_the_tensor(quant_root, storage):
    bad = "model.layers.1.mlp.down_proj.weight"
    out = quant_root / f"corrupt-{storage}"
    out.mkdir(exist_ok=True)
    sparse_dir, _ = write_sparse(make_base(quant_root, "llama"), out, SparseFmt(storage), corrupt=bad)
    what = r"model\.layers\.1\.mlp\.down_proj(\.weight|\.bitmask)? is not (2:4 sparse|a 2:4 mask).*output row 1, inputs 4\.\.7 \(3"
    with pytest.raises(CheckpointError, match=what):
        LLM(str(sparse_dir), **OPTIONS)


def test_bitmask_decoder_rejects_a_group_with_three_marks():
    mask = prune_mask(np.random.default_rng(0).standard_normal((4, 16)))
    mask[2, 0:4] = [True, True, True, False]
    mask[2, 4:8] = [True, False, False, False]
    packed = pack_bitmask(torch.ones(4, 16) * torch.from_numpy(mask), mask)
    with pytest.raises(
        CheckpointError, match=r"w\.bitmask is not a 2:4 mask: 2 groups .* row 2, inputs 0\.\.3 \(3 marked"
    ):
        decompress_bitmask(packed["compressed"], packed["bitmask"], 16, "w")


@pytest.mark.parametrize(
    ("sparsity_config", "what"),
    [
        (
            {"format": "sparse-bitmask", "sparsity_structure": "unstructured"},
            r"format='sparse-bitmask' is not supported; supported: sparse-24-bitmask, dense",
        ),
        ({"format": "marlin-24", "sparsity_structure": "2:4"}, r"format='marlin-24' is not supported"),
        (
            {"format": "dense", "sparsity_structure": "unstructured"},
            r"sparsity_structure='unstructured' is not supported; supported: '2:4'",
        ),
        ({"format": "sparse-24-bitmask", "sparsity_structure": "8:16"}, r"sparsity_structure='8:16'"),
    ],
)
def test_other_sparsity_formats_are_refused_naming_what_is_supported(sparsity_config, what):
    qc = {"quant_method": "compressed-tensors", "format": "dense", "sparsity_config": sparsity_config}
    with pytest.raises(QuantizationError, match=what):
        resolve_quantization({"quantization_config": qc})


def test_engine_pruning_equals_the_packers_magnitude_pruning():
    w = torch.randn(24, 64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(prune_24(w), w * torch.from_numpy(prune_mask(w.numpy())))


def test_on_the_fly_sparsity_warns_and_gives_transformers_tokens_on_the_pruned_twin(quant_root, prompts):
    base = make_base(quant_root, "qwen2")
    _, twin_dir = write_sparse(
        base, quant_root, SparseFmt("dense")
    )  # the same magnitude pruning, as a dense model
    with pytest.warns(
        UserWarning, match=r"sparsity='2:4' prunes half .* without retraining: expect a real loss of accuracy"
    ):
        llm = LLM(str(base), sparsity="2:4", **OPTIONS)
    got = [list(o.token_ids) for o in llm.generate(prompts, GREEDY)]
    assert got == hf_twin_greedy(twin_dir, prompts, MAX_NEW)
    dense = [list(o.token_ids) for o in LLM(str(base), **OPTIONS).generate(prompts, GREEDY)]
    assert dense != got  # pruning half the weights changes a random model's tokens
    sparsity = llm.engine.model_identity["quantization"]["sparsity"]
    assert sparsity["source"] == "magnitude pruning on the fly" and sparsity["kernel"] == "dense"


def test_on_the_fly_sparsity_refuses_a_quantized_checkpoint(quant_root):
    from tests.engine.quant_packers import Fmt, write_quantized

    quant_dir, _, _ = write_quantized(
        make_base(quant_root, "llama"), quant_root, Fmt("gptq", 4, 128, sym=True)
    )
    with pytest.raises(
        QuantizationError, match=r"sparsity='2:4' prunes full-precision weights; this is a gptq checkpoint"
    ):
        LLM(str(quant_dir), sparsity="2:4", **OPTIONS)


def test_kernel_choice():
    assert sparse_kernel(torch.device("cpu"), torch.bfloat16, False)[0] == "dense"
    assert sparse_kernel(torch.device("cuda"), torch.float32, False) == (
        "dense",
        "semi-structured sparse kernels take float16/bfloat16, not float32",
    )
    assert sparse_kernel(torch.device("cuda"), torch.bfloat16, True)[0] == "dense"


def test_packer_matches_the_compressed_tensors_library():
    """The library's sparse-24 compressor (compressed-tensors <= 0.14; later releases dropped it)."""
    lib = pytest.importorskip("compressed_tensors.compressors.sparse_compressors.sparse_24_bitmask")
    rng = np.random.default_rng(2)
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
        w = torch.from_numpy(rng.standard_normal((16, 40)).astype(np.float32))
        mask = prune_mask(w.numpy())
        pruned = (w * torch.from_numpy(mask)).to(dtype)
        ours = pack_bitmask(pruned, mask)
        values, bitmask = lib.sparse24_bitmask_compress(pruned)
        assert torch.equal(bitmask, ours["bitmask"]), dtype
        assert torch.equal(
            values.view(torch.uint8) if dtype.itemsize == 1 else values,
            ours["compressed"].view(torch.uint8) if dtype.itemsize == 1 else ours["compressed"],
        )
        back = lib.sparse24_bitmask_decompress(ours["compressed"], ours["bitmask"], [16, 40])
        assert torch.equal(back.float(), pruned.float())
        mine = decompress_bitmask(ours["compressed"], ours["bitmask"], 40, "w")
        assert torch.equal(mine.float(), pruned.float())


@pytest.mark.slow
def test_bitmask_checkpoint_two_ranks_equal_one(quant_root, prompts):
    sparse_dir, _ = write_sparse(make_base(quant_root, "qwen2"), quant_root, SparseFmt("sparse-24-bitmask"))
    want = [list(o.token_ids) for o in LLM(str(sparse_dir), **OPTIONS).generate(prompts, GREEDY)]
    with LLM(str(sparse_dir), tensor_parallel_size=2, **OPTIONS) as two:
        assert [list(o.token_ids) for o in two.generate(prompts, GREEDY)] == want

"""Quantized weights under tensor parallelism (CPU, gloo, 2 ranks, float32): the same tokens as one rank.

Each rank cuts every checkpoint tensor by the axes its LinearMethod declares (packed words along K
for GPTQ qweight, along N for AWQ, groups for scales), so a quantized layer splits like a dense one;
act-order layers keep every group on every rank. A split that would cut a packed word or a group
fails while the weights load, before any step, naming the tensor.
"""

from __future__ import annotations

import pytest

from prefixflow.engine import LLM, SamplingParams
from tests.engine.hf_models import random_prompts
from tests.engine.quant_models import make_base
from tests.engine.quant_packers import Fmt, write_quantized

OPTIONS = dict(dtype="float32", device="cpu", num_kv_blocks=64, block_size=8)
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


def _parity(model: str, **options) -> None:
    prompts = random_prompts(3, 5, 30, seed=8)
    want = [list(o.token_ids) for o in LLM(model, **OPTIONS, **options).generate(prompts, GREEDY)]
    with LLM(model, tensor_parallel_size=2, **OPTIONS, **options) as two:
        got = [list(o.token_ids) for o in two.generate(prompts, GREEDY)]
    assert got == want


def test_gptq_act_order_two_ranks_equal_one(quant_root):
    # down_proj's 320 inputs split 160 + 160 across ranks: whole groups of 32 and words of 8
    quant_dir, _, _ = write_quantized(
        make_base(quant_root, "llama"), quant_root, Fmt("gptq", 4, 32, sym=False, act_order=True)
    )
    _parity(str(quant_dir))


@pytest.mark.slow
@pytest.mark.parametrize(
    "fmt",
    [
        Fmt("gptq", 8, 32, sym=True),
        Fmt("awq", 4, 32, sym=False),
        Fmt("ct-int", 4, 32, sym=False),
        Fmt("ct-fp8"),
    ],
    ids=lambda f: f.label,
)
def test_checkpoint_formats_two_ranks_equal_one(quant_root, fmt):
    quant_dir, _, _ = write_quantized(make_base(quant_root, "qwen2"), quant_root, fmt)
    _parity(str(quant_dir))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_on_the_fly_two_ranks_equal_one(quant_root, kind):
    _parity(str(make_base(quant_root, "llama")), quantization=kind)


def test_a_split_through_a_group_is_refused(quant_root):
    quant_dir, _, _ = write_quantized(
        make_base(quant_root, "llama"), quant_root, Fmt("gptq", 4, 128, sym=True)
    )
    # raised while rank 0 loads (workers started, nothing run): the message names tensor, split and fix
    with pytest.raises(
        (ValueError, RuntimeError),
        match=r"down_proj\.qzeros: this rank's 160 inputs at offset 0 do not fall on whole 128",
    ):
        LLM(str(quant_dir), tensor_parallel_size=2, **OPTIONS)

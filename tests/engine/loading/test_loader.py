"""Loading real HF directories: sharded safetensors, EOS ids, and clear refusals."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from prefixflow.engine import LLM, SamplingParams
from prefixflow.engine.loading.loader import ModelNotFoundError, load_hf_dir
from prefixflow.engine.loading.model_config import ModelConfig, UnsupportedModelError
from tests.engine.hf_models import hf_greedy, random_prompts


def test_sharded_checkpoint_with_index_loads_and_matches(llama_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sharded = tmp_path / "sharded"
    model = AutoModelForCausalLM.from_pretrained(str(llama_dir), dtype=torch.float32)
    model.save_pretrained(str(sharded), max_shard_size="100KB")
    AutoTokenizer.from_pretrained(str(llama_dir)).save_pretrained(str(sharded))
    assert (sharded / "model.safetensors.index.json").exists()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    prompts = random_prompts(2, 5, 20, seed=11)
    outs = LLM(str(sharded), dtype="float32").generate(prompts, SamplingParams(max_tokens=5, ignore_eos=True))
    assert [list(o.token_ids) for o in outs] == hf_greedy(llama_dir, prompts, 5)


def test_eos_ids_come_from_generation_config(llama_dir, tmp_path):
    d = tmp_path / "eos"
    shutil.copytree(llama_dir, d)
    gen = json.loads((d / "generation_config.json").read_text())
    gen["eos_token_id"] = [7, 9]
    (d / "generation_config.json").write_text(json.dumps(gen))
    source = load_hf_dir(d)
    assert source.eos_token_ids[:2] == (7, 9)


def test_pickled_checkpoints_are_refused(tmp_path, llama_dir):
    d = tmp_path / "pickled"
    d.mkdir()
    shutil.copy(llama_dir / "config.json", d / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(llama_dir / name, d / name)
    (d / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelNotFoundError, match="pickled checkpoints are never loaded"):
        LLM(str(d))


def test_unsupported_architecture_is_named():
    with pytest.raises(UnsupportedModelError, match=r"GPT2LMHeadModel.*supported: LlamaForCausalLM"):
        ModelConfig.from_hf({"architectures": ["GPT2LMHeadModel"], "hidden_size": 8})


def test_missing_tensor_is_named(tmp_path, llama_dir):
    from safetensors.torch import load_file, save_file

    d = tmp_path / "missing"
    shutil.copytree(llama_dir, d)
    tensors = load_file(str(d / "model.safetensors"))
    tensors.pop("model.layers.1.mlp.up_proj.weight")
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing 1 tensors.*mlp.up_proj"):
        LLM(str(d))


def test_qwen_and_llama3_configs_parse():
    llama3 = ModelConfig.from_hf(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 10,
            "hidden_size": 64,
            "intermediate_size": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0},
        }
    )
    assert llama3.rope_theta == 500000.0 and llama3.rope_scaling["rope_type"] == "llama3"
    assert llama3.num_kv_heads == 4 and llama3.head_dim == 16
    qwen2 = ModelConfig.from_hf(
        {
            "architectures": ["Qwen2ForCausalLM"],
            "vocab_size": 10,
            "hidden_size": 64,
            "intermediate_size": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "sliding_window": 32,
        }
    )
    assert qwen2.attention_bias and qwen2.sliding_window is None  # use_sliding_window defaults off

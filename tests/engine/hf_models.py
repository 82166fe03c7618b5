"""Tiny random Hugging Face checkpoints of each supported architecture, saved as real directories."""

from __future__ import annotations

from pathlib import Path

import torch

from prefixflow.engine.loading.presets import save_random_model

BASE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
)

ARCHITECTURES: dict[str, dict] = {
    "llama-gqa-llama3rope": dict(
        BASE,
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tie_word_embeddings=False,
        attention_bias=True,  # q/k/v and o_proj biases: o_proj's is added once after the TP all-reduce
    ),
    "mistral-mqa": dict(
        BASE,
        architectures=["MistralForCausalLM"],
        model_type="mistral",
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=None,
        tie_word_embeddings=False,
    ),
    "qwen2-bias-tied": dict(
        BASE,
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        use_sliding_window=False,
    ),
    "qwen3-qknorm-headdim": dict(
        BASE,
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # != hidden / heads: the explicit head_dim path
        tie_word_embeddings=False,
        use_sliding_window=False,
    ),
}


def make_model_dir(root: Path, name: str, seed: int = 0) -> Path:
    out = root / name
    if not (out / "config.json").exists():
        save_random_model(ARCHITECTURES[name], out, seed=seed)
        _spread_biases(out)
    return out


def _spread_biases(out: Path) -> None:
    """transformers zero-inits biases and norm weights; randomise them so the test can see a bug there."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    tensors = load_file(str(path))
    gen = torch.Generator().manual_seed(1)
    for name, t in tensors.items():
        if name.endswith(".bias") or "norm" in name:
            tensors[name] = (t + 0.1 * torch.randn(t.shape, generator=gen)).contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Reference: transformers' own generate, one prompt at a time (no padding), EOS ignored."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(y[0, len(ids) :].tolist())
    return outs


def random_prompts(n: int, lo: int, hi: int, vocab: int = 500, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
    return [torch.randint(3, vocab, (length,), generator=gen).tolist() for length in lengths]

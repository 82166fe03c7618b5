"""GGUF loader on small GGUF files this test writes itself from tiny random transformers Llama models.

Each file is written the way llama.cpp's converter does it (its tensor names, query/key rows permuted
for its rotary layout, norms kept in F32), so the loader's real parsing, dequantization and
un-permutation run; the expected tensors come from the original transformers model.
"""

from __future__ import annotations

import copy
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from transformers import LlamaConfig, LlamaForCausalLM

from prefixflow.engine.gguf import SUPPORTED_TYPES, find_gguf_file, load_gguf_source
from prefixflow.engine.loading.model_identity import ModelNotFoundError, locate_model

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
# Every 2-D weight row is 256 long, so the K-quant types (256-value super-blocks) fit too.
TINY = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    rope_theta=50000.0,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
)
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def byte_level_tokens() -> list[str]:
    """GPT-2's byte-to-printable-character table: bytes that print stay, the rest shift past 255."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


TOKENS = SPECIALS + byte_level_tokens() + [m.replace(" ", "") for m in MERGES]


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if hf in top:
        return top[hf]
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{LAYER_NAMES[rest]}"


def to_llama_cpp_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter order: each head's two rotary halves interleaved row by row."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_kquant_rows(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant bytes with sane fp16 block scales (gguf can dequantize but not quantize K types)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    scale_offsets = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}[qtype]
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for off in scale_offsets:
        scales = rng.uniform(1e-3, 2e-2, size=(rows, cols // block)).astype(np.float16)
        data[:, :, off : off + 2] = scales.view(np.uint8).reshape(rows, cols // block, 2)
    return data.reshape(rows, -1)


def tiny_hf_model(tied: bool = False, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(TOKENS), tie_word_embeddings=tied, **TINY)
    return LlamaForCausalLM(cfg).eval()


def write_gguf(
    path: Path,
    model: LlamaForCausalLM,
    qtype: Q = Q.F32,
    arch: str = "llama",
    raw: dict[str, tuple[np.ndarray, Q]] | None = None,
    extra_tensor: tuple[str, np.ndarray, Q] | None = None,
    rope_freqs: np.ndarray | None = None,
) -> Path:
    """Write ``model`` as llama.cpp would; 2-D weights in ``qtype``, or pre-made bytes from ``raw``."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test-llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(TINY["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(TOKENS)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_eot_token_id(0)
    w.add_chat_template(CHAT_TEMPLATE)
    raw = raw or {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        arr = t.detach().float().numpy()
        n_head = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}.get(
            name.split(".")[-2]
        )
        if name in raw:
            arr, kind = raw[name]
        elif arr.ndim == 2 and qtype != Q.F32:
            arr, kind = quantize(arr, qtype), qtype
        else:
            kind = Q.F32
        if n_head is not None:
            arr = to_llama_cpp_rows(arr, n_head)  # row order only: works on quantized bytes too
        w.add_tensor(gguf_name(name), arr, raw_dtype=None if kind == Q.F32 else kind)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    if extra_tensor is not None:
        name, arr, kind = extra_tensor
        w.add_tensor(name, arr, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


pytestmark = pytest.mark.usefixtures("private_cache")  # tests/engine/conftest.py


@pytest.fixture(scope="module")
def hf_model() -> LlamaForCausalLM:
    return tiny_hf_model()


@pytest.fixture(scope="module")
def f32_file(hf_model, tmp_path_factory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", hf_model)


def test_config_matches_the_transformers_config(hf_model, f32_file):
    src = load_gguf_source(f32_file)
    cfg, hf = src.hf_config, hf_model.config
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "vocab_size",
        "bos_token_id",
        "eos_token_id",
    ):
        assert cfg[key] == getattr(hf, key), key
    assert cfg["rms_norm_eps"] == pytest.approx(hf.rms_norm_eps)
    assert cfg["rope_theta"] == pytest.approx(50000.0)
    assert cfg["tie_word_embeddings"] is False
    assert "rope_scaling" not in cfg
    assert cfg["torch_dtype"] == "float32"


def dense_weights(src) -> dict[str, torch.Tensor]:
    """The source's tensors, packed GGUF blocks (Q8_0/Q4_0/Q4_1 projections) dequantized by the engine."""
    from prefixflow.engine.quantization.gguf_blocks import dense_from_gguf, kind_of

    out = {}
    for name, tensor in src.weights():
        module, _, param = name.rpartition(".")
        if kind_of(param):
            name, tensor = f"{module}.weight", dense_from_gguf(param, tensor, tensor.shape[1] * 32)
        out[name] = tensor
    return out


def test_f32_weights_round_trip_exactly_with_qk_rows_restored(hf_model, f32_file):
    got = dict(load_gguf_source(f32_file).weights())
    want = hf_model.state_dict()
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == torch.float32
        assert torch.equal(got[name], tensor), name
    # The permutation is not the identity, so the check above really exercised the un-permutation.
    q = want["model.layers.0.self_attn.q_proj.weight"].numpy()
    assert not np.array_equal(to_llama_cpp_rows(q, 8), q)


def test_tokenizer_eos_and_chat_template_come_from_the_metadata(f32_file):
    src = load_gguf_source(f32_file)
    assert src.eos_token_ids == (2, 0)
    assert src.chat_template == CHAT_TEMPLATE
    tok = src.tokenizer
    ids = tok("the cat in a hat", add_special_tokens=False).input_ids
    assert tok.decode(ids) == "the cat in a hat"
    assert TOKENS.index("he") in ids  # merges are applied
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2
    assert src.location is not None and src.location.kind == "gguf" and src.location.path == f32_file


@pytest.mark.parametrize(
    "qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1], ids=lambda q: q.name
)
def test_quantized_weights_dequantize_to_what_was_quantized(hf_model, tmp_path, qtype):
    path = write_gguf(tmp_path / f"tiny-{qtype.name}.gguf", hf_model, qtype=qtype)
    raw_names = {name for name, _ in load_gguf_source(path).weights()}
    if qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1):  # projections stay packed; the engine unpacks them exactly
        assert f"model.layers.0.mlp.up_proj.gguf_{qtype.name.lower()}" in raw_names
        assert "model.embed_tokens.weight" in raw_names
    got = dense_weights(load_gguf_source(path))
    for name, tensor in hf_model.state_dict().items():
        arr = tensor.float().numpy()
        if arr.ndim == 2:
            # Quantization works within rows and the q/k permutation moves whole rows, so quantizing
            # the HF tensor directly gives the same values as the permuted file holds.
            want = dequantize(quantize(arr, qtype), qtype).reshape(arr.shape)
            assert np.abs(want - arr).max() < 0.2 * np.abs(arr).max()  # sanity: a real approximation
        else:
            want = arr
        np.testing.assert_array_equal(got[name].numpy(), want, err_msg=name)


@pytest.mark.parametrize("qtype", [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda q: q.name)
def test_k_quant_weights_dequantize_and_unpermute(hf_model, tmp_path, qtype):
    rng = np.random.default_rng(int(qtype))
    raw = {}
    for name, tensor in hf_model.state_dict().items():
        if tensor.ndim == 2 and ("layers.1." in name or name.endswith("q_proj.weight")):
            raw[name] = (random_kquant_rows(qtype, *tensor.shape, rng), qtype)
    path = write_gguf(tmp_path / f"tiny-{qtype.name}.gguf", hf_model, raw=raw)
    got = dict(load_gguf_source(path).weights())
    for name, (data, _) in raw.items():
        want = dequantize(data, qtype)
        assert np.isfinite(want).all() and want.std() > 0
        np.testing.assert_array_equal(got[name].numpy(), want, err_msg=name)


def test_requested_dtype_and_tied_embeddings(tmp_path):
    model = tiny_hf_model(tied=True, seed=1)
    src = load_gguf_source(write_gguf(tmp_path / "tied.gguf", model), dtype=torch.bfloat16)
    assert src.hf_config["tie_word_embeddings"] is True
    assert src.hf_config["torch_dtype"] == "bfloat16"
    got = dict(src.weights())
    assert "lm_head.weight" not in got
    emb = model.state_dict()["model.embed_tokens.weight"]
    assert got["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert torch.equal(got["model.embed_tokens.weight"], emb.to(torch.bfloat16))


def test_llama3_rope_freqs_tensor_becomes_rope_scaling(hf_model, tmp_path):
    head_dim, theta = 32, 50000.0
    factor, low, high, original = 8.0, 1.0, 4.0, 8192
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
    wavelen = 2 * np.pi / inv_freq
    divisors = []  # as llama.cpp's converter writes them for Llama 3.1
    for wl in wavelen:
        if wl < original / high:
            divisors.append(1.0)
        elif wl > original / low:
            divisors.append(factor)
        else:
            smooth = (original / wl - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    assert len(set(divisors)) > 2  # the test's theta makes some frequencies fall in the smooth band
    path = write_gguf(tmp_path / "llama3.gguf", hf_model, rope_freqs=np.array(divisors))
    src = load_gguf_source(path)
    assert src.hf_config["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original,
    }
    assert "rope_freqs.weight" not in dict(src.weights())


def test_unsupported_architecture_is_named(hf_model, tmp_path):
    path = write_gguf(tmp_path / "gpt2.gguf", hf_model, arch="gpt2")
    with pytest.raises(ValueError, match=r"unsupported GGUF architecture 'gpt2'.*supported: llama"):
        load_gguf_source(path)


def test_unsupported_tensor_type_is_named(hf_model, tmp_path):
    assert Q.IQ4_NL not in SUPPORTED_TYPES
    block, size = gguf.GGML_QUANT_SIZES[Q.IQ4_NL]
    name = "model.layers.0.mlp.up_proj.weight"
    raw = {name: (np.zeros((512, 256 // block * size), np.uint8), Q.IQ4_NL)}
    path = write_gguf(tmp_path / "iq4.gguf", hf_model, raw=raw)
    with pytest.raises(
        ValueError, match=r"unsupported GGUF tensor type IQ4_NL \(tensor 'blk\.0\.ffn_up\.weight'\).*Q4_K"
    ):
        load_gguf_source(path)


def test_unknown_tensor_is_named(hf_model, tmp_path):
    extra = ("blk.0.ffn_gate_exps.weight", np.zeros((4, 256), np.float32), None)
    path = write_gguf(tmp_path / "moe.gguf", hf_model, extra_tensor=extra)
    with pytest.raises(ValueError, match="blk.0.ffn_gate_exps.weight"):
        load_gguf_source(path)


def test_directory_with_one_gguf_loads(hf_model, f32_file, tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "model.gguf").write_bytes(f32_file.read_bytes())
    (d / "README.md").write_text("notes")
    assert locate_model(d).path == locate_model(d / "model.gguf").path == d / "model.gguf"
    assert find_gguf_file(d) == d / "model.gguf"
    src = load_gguf_source(d)
    assert torch.equal(dict(src.weights())["model.norm.weight"], hf_model.state_dict()["model.norm.weight"])


def test_directory_without_or_with_several_ggufs_lists_its_files(f32_file, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="no .gguf file.*config.txt"):
        load_gguf_source(empty)
    several = tmp_path / "several"
    several.mkdir()
    for name in ("a.Q4_0.gguf", "b.Q8_0.gguf"):
        (several / name).write_bytes(f32_file.read_bytes())
    with pytest.raises(ValueError, match="2 .gguf files.*a.Q4_0.gguf, b.Q8_0.gguf"):
        load_gguf_source(several)
    with pytest.raises(ModelNotFoundError, match="2 .gguf files.*a.Q4_0.gguf, b.Q8_0.gguf"):
        locate_model(several)
    with pytest.raises(ModelNotFoundError, match="neither config.json"):
        locate_model(empty)


def test_hf_directory_that_also_holds_a_gguf_is_an_hf_directory(f32_file, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "m.gguf").write_bytes(b"")
    assert locate_model(tmp_path).kind == "hf"


@pytest.mark.parametrize("as_dir", [False, True])
def test_engine_on_a_gguf_path_matches_the_transformers_model(hf_model, f32_file, tmp_path, as_dir):
    from prefixflow.engine import LLM, SamplingParams

    model = f32_file
    if as_dir:
        model = tmp_path / "dir"
        model.mkdir()
        (model / "tiny.gguf").write_bytes(f32_file.read_bytes())
    llm = LLM(model=str(model), dtype="float32", device="cpu")
    prompts = [[5, 60, 70, 80], list(range(30, 75)), [200, 17, 99, 99, 3, 40, 41]]
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    no_eos = copy.deepcopy(hf_model.generation_config)
    no_eos.eos_token_id = None  # like ignore_eos: always 8 tokens
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            gen = hf_model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=8,
                do_sample=False,
                generation_config=no_eos,
            )
        assert list(out.token_ids) == gen[0, len(prompt) :].tolist()
        assert len(out.token_ids) == 8


def test_tokenizer_is_cached_by_content_and_reloads_identically(f32_file, tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIXFLOW_CACHE", str(tmp_path / "cache"))
    first = load_gguf_source(f32_file).tokenizer
    saved = list((tmp_path / "cache" / "gguf-tokenizers").glob("*/tokenizer.json"))
    assert len(saved) == 1
    second = load_gguf_source(f32_file).tokenizer  # now read from the cache
    assert len(list((tmp_path / "cache" / "gguf-tokenizers").iterdir())) == 1
    text = "the cat <|im_start|>in a hat\n\twith  spaces é<|im_end|>"
    assert second(text).input_ids == first(text).input_ids
    assert (second.eos_token_id, second.bos_token_id) == (first.eos_token_id, first.bos_token_id) == (2, 1)
    assert second.chat_template == CHAT_TEMPLATE
    # Another file gets its own entry: the key is the content, not the name.
    other = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=5))
    load_gguf_source(other)
    assert len(list((tmp_path / "cache" / "gguf-tokenizers").glob("*/tokenizer.json"))) == 2

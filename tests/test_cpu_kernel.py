"""The CPU attention kernel (sparsespec.kernels.cpu_attention): built where a compiler is found, in
each of its builds (the processor's own and, on x86-64, the AVX2 one), each equal to the reference
path (output, LSE and the recall index's per-key mass) for 1 to 130 new tokens over up to 128k keys,
in float32 and bfloat16 K/V; where it cannot be built, one logged line and PyTorch's path, which
equals the reference too; and the attention path takes it only where its calibration measured it
at least as fast as PyTorch's."""

from __future__ import annotations

import json
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
    def no_compiler(build="native"):
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


def _builds():
    """The builds this machine makes (the AVX2 one only on x86-64), each a test case."""
    return [pytest.param(b, id=b) for b in cpu_attention.builds()]


@pytest.mark.parametrize("build", _builds())
def test_each_build_is_compiled_for_its_instruction_set(build):
    if not _compiler():
        pytest.skip("no C++ compiler")
    flags = open("/proc/cpuinfo").read() if build == "native" else ""
    expected = 16 if build == "native" and " avx512f" in flags else 8
    assert cpu_attention.vector_width(build) == expected


def test_the_switch_turns_the_kernel_off(monkeypatch):
    monkeypatch.setenv(cpu_attention.ENV, "0")
    assert not cpu_attention.available() and not cpu_attention.applies(torch.zeros(1, 1, 64), torch.zeros(1, 1, 64))


def _case(hq, hkv, n, total, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(hkv, total + 40, d, generator=g)[:, :total].to(dtype)  # a cache slice: strided heads
    v = torch.randn(hkv, total + 40, d, generator=g)[:, :total].to(dtype)
    return torch.randn(hq, n, d, generator=g), k, v


def _kernel(build="native"):
    """A build's two functions, or where it cannot be built the paths that serve instead."""
    if cpu_attention.available(build):
        return (lambda q, k, v, scale: cpu_attention.few_rows_attention(q, k, v, scale, build)), \
            (lambda q, lse, k, scale: cpu_attention.attention_mass(q, lse, k, scale, build))
    return ((lambda q, k, v, scale: attend(q, k.float(), v.float(), scale, lse_rows=q.shape[1])),
            (lambda q, lse, k, scale: attention_mass(q, lse, k.float(), scale)))


def _check(q, k, v, atol, build="native"):
    n, total = q.shape[1], k.shape[1]
    few_rows, mass = _kernel(build)
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


@pytest.mark.parametrize("build", _builds())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_reference_for_1_to_130_new_tokens(dtype, build):
    for hq, hkv, d in ((9, 3, 64), (4, 2, 16), (8, 1, 128), (2, 2, 32), (14, 2, 64)):
        for total in (1, 17, 130, 515, 4103):
            for n in (1, 2, 3, 5, 8, 17, 64, 130):
                if n <= total:
                    _check(*_case(hq, hkv, n, total, d, dtype, seed=n + total), atol=2e-5, build=build)


@pytest.mark.parametrize("build", _builds())
def test_kernel_at_128k_keys(build):
    for n in (1, 5, 130):
        _check(*_case(3, 1, n, 128 * 1024, 64, torch.float32, seed=n), atol=2e-5, build=build)


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


@pytest.fixture
def calibrated(monkeypatch, tmp_path):
    """The choice as a user gets it (the switch unset), calibrations saved under tmp_path, and a
    calibration that reports the times of `table` ({(op, n bucket): (kernel ms, PyTorch ms)})."""
    if not cpu_attention.available():
        pytest.skip("no kernel build here")
    monkeypatch.delenv(cpu_attention.ENV, raising=False)
    monkeypatch.setenv("SPARSESPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_attention, "_calibration", {})
    monkeypatch.setattr(cpu_attention, "_build_dir", lambda build: tmp_path)
    table, measured = {}, []

    def calibrate(op, group, n, d, dtype, pytorch):
        measured.append((op, group, n, d))
        return list(table[(op, n)])

    monkeypatch.setattr(cpu_attention, "calibrate", calibrate)
    return table, measured


def test_the_attention_path_takes_the_faster_of_kernel_and_pytorch(calibrated, monkeypatch):
    table, measured = calibrated
    table.update({("attention", 1): (10.0, 20.0), ("attention", 5): (30.0, 20.0), ("mass", 5): (5.0, 50.0),
                  ("mass", 17): (60.0, 50.0)})
    calls = []
    real = cpu_attention.few_rows_attention, cpu_attention.attention_mass
    monkeypatch.setattr(cpu_attention, "few_rows_attention", lambda *a: calls.append("kernel") or real[0](*a))
    monkeypatch.setattr(cpu_attention, "attention_mass", lambda *a: calls.append("kernel mass") or real[1](*a))
    k, v = torch.randn(3, 600, 64), torch.randn(3, 600, 64)
    # attention is judged at one new token for every count (a verification pass takes the path of the
    # one-token steps it reproduces), so the 5-row entry does not decide; the mass has its own counts
    for n, mass_n, want in ((1, 5, ["kernel", "kernel mass"]), (4, 17, ["kernel"]), (5, 10, ["kernel"])):
        calls.clear()
        q = torch.randn(9, n, 64)
        out, lse = attend(q, k, v, 0.125, lse_rows=n)
        ref, ref_lse = _attend_reference(q, k, v, 0.125, causal_block_mask(n, 600), n)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)  # whichever path serves, the same result
        attention_mass(torch.randn(9, mass_n, 64), torch.full((9, mass_n), 9.0), k, 0.125)
        assert calls == want, (n, mass_n)
    # one measurement per (op, group, calibrated count, head size), then the saved choice
    assert measured == [("attention", 3, 1, 64), ("mass", 3, 5, 64), ("mass", 3, 17, 64)]
    saved = json.loads((cpu_attention._build_dir("native") / "calibration.json").read_text())
    assert saved["attention g3 n1 d64 float32"] == [10.0, 20.0] and saved["mass g3 n17 d64 float32"] == [60.0, 50.0]
    monkeypatch.setattr(cpu_attention, "_calibration", {})  # a new process reads the saved choices
    attend(torch.randn(9, 1, 64), k, v, 0.125)
    assert len(measured) == 3 and calls[-1] == "kernel"


def test_the_switch_on_skips_the_calibration(calibrated, monkeypatch):
    _, measured = calibrated
    monkeypatch.setenv(cpu_attention.ENV, "1")
    assert cpu_attention.applies(torch.randn(9, 5, 64), torch.randn(3, 600, 64), "attention", lambda *a: None)
    assert measured == []


def test_a_calibration_times_the_kernel_and_the_pytorch_path_on_the_same_tensors(monkeypatch):
    if not cpu_attention.available():
        pytest.skip("no kernel build here")
    monkeypatch.setattr(cpu_attention, "CALIBRATION_KEYS", 256)
    monkeypatch.setattr(cpu_attention, "CALIBRATION_BYTES", 1 << 20)
    seen = []

    def pytorch(q, k, v, scale):
        seen.append((tuple(q.shape), tuple(k.shape), scale))
        return attend(q, k, v, scale)

    kernel_ms, pytorch_ms = cpu_attention.calibrate("attention", 4, 5, 32, torch.float32, pytorch)
    assert kernel_ms > 0 and pytorch_ms > 0
    layers = -(-(1 << 20) // (2 * 2 * 256 * 32 * 4))  # K and V of 2 heads x 256 keys x 32 floats a layer
    assert seen[0] == ((8, 5, 32), (2, 256, 32), 32 ** -0.5) and len(seen) == 4 * layers  # warm-up + 3 timed passes


def test_a_calibration_runs_in_the_cache_dtype(monkeypatch):
    """A bfloat16 model attends with bfloat16 queries: the PyTorch path is timed with them."""
    if not cpu_attention.available():
        pytest.skip("no kernel build here")
    monkeypatch.setattr(cpu_attention, "CALIBRATION_KEYS", 256)
    monkeypatch.setattr(cpu_attention, "CALIBRATION_BYTES", 1 << 18)
    from sparsespec.kv.capture import _pytorch_mass
    from sparsespec.models.attention import _pytorch_few_rows

    for op, path in (("attention", _pytorch_few_rows), ("mass", _pytorch_mass)):
        kernel_ms, pytorch_ms = cpu_attention.calibrate(op, 3, 5, 64, torch.bfloat16, path)
        assert kernel_ms > 0 and pytorch_ms > 0


@pytest.mark.parametrize("build", _builds())
def test_a_new_token_attends_the_same_in_a_block_as_alone(build):
    """Bit for bit: token i of a block of n new tokens against the block attending alone over the
    keys it sees (output, log-sum-exp and the index's mass), whatever the row count."""
    if not cpu_attention.available(build):
        pytest.skip("no kernel build here")
    for hq, hkv, d in ((9, 3, 64), (4, 2, 16), (14, 2, 64)):
        for total in (17, 515, 1030):
            for n in (2, 5, 17):
                q, k, v = _case(hq, hkv, n, total, d, torch.float32, seed=n + total)
                out, lse = cpu_attention.few_rows_attention(q, k, v, 0.125, build)
                mass = cpu_attention.attention_mass(q, lse, k, 0.125, build)
                for i in range(n):
                    seen = total - n + i + 1
                    one, one_lse = cpu_attention.few_rows_attention(q[:, i : i + 1], k[:, :seen], v[:, :seen], 0.125,
                                                                    build)
                    assert torch.equal(one[:, 0], out[:, i]) and torch.equal(one_lse[:, 0], lse[:, i]), (d, total, n, i)
                    one_mass = cpu_attention.attention_mass(q[:, i : i + 1], lse[:, i : i + 1], k[:, :seen], 0.125,
                                                            build)
                    assert torch.equal(one_mass[:, 0], mass[:, i, :seen])


def _int8_case(hq, hkv, n, total, d, seed):
    """An int8 view as the cache holds it: rows of a larger buffer (strided heads), per-row scales."""
    from sparsespec.kv.quantized import quantize_int8

    q, k, v = _case(hq, hkv, n, total, d, torch.float32, seed)
    (kq, ks), (vq, vs) = quantize_int8(torch.randn(hkv, total + 40, d)), quantize_int8(torch.randn(hkv, total + 40, d))
    kq[:, :total], ks[:, :total] = quantize_int8(k)
    vq[:, :total], vs[:, :total] = quantize_int8(v)
    return q, kq[:, :total], ks[:, :total], vq[:, :total], vs[:, :total]


@pytest.mark.parametrize("build", _builds())
def test_the_int8_path_equals_the_float32_kernel_on_the_dequantized_view(build):
    """Bit for bit: an int8 view's keys and values are dequantized as the PyTorch path does it (one
    float32 product per element), so the output and log-sum-exp are the float32 kernel's over the
    dequantized view; and the reference's within rounding."""
    if not cpu_attention.available(build):
        pytest.skip("no kernel build here")
    from sparsespec.kv.quantized import Int8Rows

    for hq, hkv, d in ((9, 3, 64), (4, 2, 16), (8, 1, 128), (2, 2, 32)):
        for total in (1, 17, 515, 1030):
            for n in (1, 3, 17):
                if n > total:
                    continue
                q, kq, ks, vq, vs = _int8_case(hq, hkv, n, total, d, seed=n + total)
                out, lse = cpu_attention.few_rows_attention_int8(q, kq, ks, vq, vs, 0.125, build)
                k, v = Int8Rows(kq, ks).dequantize(), Int8Rows(vq, vs).dequantize()
                ref, ref_lse = cpu_attention.few_rows_attention(q, k, v, 0.125, build)
                assert torch.equal(out, ref) and torch.equal(lse, ref_lse), (d, total, n)
                exact, exact_lse = _attend_reference(q, k, v, 0.125, causal_block_mask(n, total), n)
                torch.testing.assert_close(out, exact, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("build", _builds())
def test_an_int8_view_attends_the_same_in_a_block_as_alone(build):
    """Row invariance holds for the int8 path too: token i of a block equals a one-token step."""
    if not cpu_attention.available(build):
        pytest.skip("no kernel build here")
    for hq, hkv, d in ((9, 3, 64), (4, 2, 16)):
        for total in (17, 1030):
            n = 5
            q, kq, ks, vq, vs = _int8_case(hq, hkv, n, total, d, seed=total)
            out, lse = cpu_attention.few_rows_attention_int8(q, kq, ks, vq, vs, 0.125, build)
            for i in range(n):
                s = total - n + i + 1
                one, one_lse = cpu_attention.few_rows_attention_int8(q[:, i : i + 1], kq[:, :s], ks[:, :s], vq[:, :s],
                                                                     vs[:, :s], 0.125, build)
                assert torch.equal(one[:, 0], out[:, i]) and torch.equal(one_lse[:, 0], lse[:, i])


def test_attend_reads_a_low_precision_view_through_the_kernel_or_dequantizes_it(monkeypatch):
    """attend over bf16 keys with float32 queries, and over an int8 view: the kernel where it
    applies; with an explicit mask (or the kernel off) the view dequantized first, the same numbers."""
    from sparsespec.kv.quantized import Int8Rows

    calls = []
    real = cpu_attention.few_rows_attention_int8
    monkeypatch.setattr(cpu_attention, "few_rows_attention_int8", lambda *a: calls.append("int8") or real(*a))
    q, kq, ks, vq, vs = _int8_case(9, 3, 3, 600, 64, seed=1)
    k, v = Int8Rows(kq, ks), Int8Rows(vq, vs)
    out, lse = attend(q, k, v, 0.125, lse_rows=3)
    masked, masked_lse = attend(q, k, v, 0.125, mask=causal_block_mask(3, 600), lse_rows=3)
    torch.testing.assert_close(out, masked, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse, masked_lse, atol=2e-5, rtol=1e-4)
    assert calls == (["int8"] if _compiler() else [])
    kb, vb = k.dequantize(torch.bfloat16), v.dequantize(torch.bfloat16)
    out_b, _ = attend(q, kb, vb, 0.125)
    ref, _ = _attend_reference(q, kb.float(), vb.float(), 0.125, causal_block_mask(3, 600))
    torch.testing.assert_close(out_b, ref, atol=2e-5, rtol=1e-4)
    assert out_b.dtype == torch.float32

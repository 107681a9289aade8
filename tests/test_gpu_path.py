"""The CUDA path's logic, checked on the CPU with stand-ins: CUDA events that complete late, flash-attn
modules that are too old or fail to import, bfloat16 inputs against float32 references, parameters
that live off the host. What only a GPU can show is in the CUDA-only tests at the end (run by
scripts/gpu_check.sh on a GPU machine)."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, random_prompt, tiny_lm
from fake_cuda import MS_PER_EVENT, install

import sparsespec.decoding.drafters as drafters_module
import sparsespec.decoding.engine as engine_module
import sparsespec.kv.recall as recall_module
from sparsespec.clock import DeviceClock
from sparsespec.decoding.controllers import EntropyController, FixedK
from sparsespec.decoding.drafters import SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.kv.policies import StreamingKV
from sparsespec.kv.recall import RecallIndex

cuda_only = pytest.mark.skipif(DEVICE.type != "cuda", reason="needs SPARSESPEC_TEST_DEVICE=cuda")


# -- device time ----------------------------------------------------------------------------------


def test_a_span_whose_end_has_not_completed_waits_for_it(monkeypatch):
    from fake_cuda import FakeEvent

    stream = install(monkeypatch)
    clock = DeviceClock("cuda")
    a, b = clock.mark(), clock.mark()
    assert not b.query()
    with pytest.raises(RuntimeError, match="Both events must be completed"):
        a.elapsed_time(b)  # what torch.cuda.Event does
    assert clock.seconds(a, b) == pytest.approx(MS_PER_EVENT / 1000)
    assert clock.late_reads == 1 and stream.reached == 2 and isinstance(a, FakeEvent)


@pytest.mark.parametrize("method", ["ar", "magicdec", "sparsespec_l"])
def test_every_method_runs_its_rounds_with_events_that_complete_late(monkeypatch, method):
    """On CUDA the engine's marks are events; the round's last one is recorded after the host read
    and has not completed when the round reads its span."""
    install(monkeypatch, engine_module, drafters_module, recall_module)
    target = tiny_lm()
    prompt = random_prompt(120, seed=1)
    ar = SpeculativeEngine(target).generate(prompt, 12).output_ids
    parts = {"ar": (None, FixedK()), "magicdec": (SelfDrafter(StreamingKV(budget=24, k_sink=2)), FixedK(3)),
             "sparsespec_l": (SelfDrafter(RecallIndex(ratio=0.1, k_sink=2, k_recent=4)), EntropyController())}[method]
    res = SpeculativeEngine(target, *parts).generate(prompt, 12)
    assert res.output_ids == ar
    assert res.verify_s > 0 and res.verify_s == pytest.approx(round(res.verify_s / (MS_PER_EVENT / 1000))
                                                              * MS_PER_EVENT / 1000)


def test_the_recall_index_cost_is_device_time(monkeypatch):
    """Every refresh is one span of device work (here: exactly one fake event apart), not the host's
    launch time."""
    install(monkeypatch, engine_module, drafters_module, recall_module)
    res = SpeculativeEngine(tiny_lm(), SelfDrafter(RecallIndex(ratio=0.1, k_sink=2, k_recent=4)),
                            FixedK(3)).generate(random_prompt(120, seed=2), 12)
    span = MS_PER_EVENT / 1000
    assert res.extra["index_updates"] > 0
    assert res.extra["index_update_s"] == pytest.approx(res.extra["index_updates"] * span)
    assert res.extra["index_seed_s"] == pytest.approx(span)


# -- flash-attn: decided once, imported once, refused when too old or broken -----------------------


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """Writes a `flash_attn` package on the path (its __init__ as given) and makes the choice anew."""
    import sys

    from sparsespec.models import attention

    def make(init: str) -> None:
        (tmp_path / "flash_attn").mkdir()
        (tmp_path / "flash_attn" / "__init__.py").write_text(init)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
        attention.flash_attn_func.cache_clear()

    yield make
    attention.flash_attn_func.cache_clear()
    sys.modules.pop("flash_attn", None)


CUDA, BF16 = torch.device("cuda"), torch.bfloat16


def _flash_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "flash-attn" in r.getMessage()]


def test_flash_attn_older_than_2_1_is_not_used_and_said_once(stand_in, caplog):
    from sparsespec.models.attention import flash_attn_applies

    stand_in("__version__ = '2.0.9'\ndef flash_attn_func(*a, **k):\n    raise AssertionError('called')\n")
    assert not any(flash_attn_applies(CUDA, BF16) for _ in range(3))
    lines = _flash_lines(caplog)
    assert len(lines) == 1 and "2.0.9 is older than 2.1" in lines[0] and "PyTorch's attention" in lines[0]


def test_flash_attn_that_fails_to_import_is_not_used_and_said_once(stand_in, caplog):
    from sparsespec.models.attention import flash_attn_applies

    stand_in("raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c10')\n")
    assert not any(flash_attn_applies(CUDA, BF16) for _ in range(3))
    lines = _flash_lines(caplog)
    assert len(lines) == 1 and "cannot be imported (ImportError: flash_attn_2_cuda.so" in lines[0]


def test_a_usable_flash_attn_is_imported_once(stand_in, caplog):
    from sparsespec.models import attention

    stand_in("import builtins\nbuiltins.flash_attn_imports = getattr(builtins, 'flash_attn_imports', 0) + 1\n"
             "__version__ = '2.6.3'\ndef flash_attn_func(*a, **k):\n    return 'flash'\n")
    import builtins

    builtins.flash_attn_imports = 0
    assert all(attention.flash_attn_applies(CUDA, BF16) for _ in range(3))
    assert not attention.flash_attn_applies(CUDA, torch.float32)  # fp32: PyTorch's kernels
    assert not attention.flash_attn_applies(torch.device("cpu"), BF16)
    assert attention.flash_attn_func()() == "flash" and builtins.flash_attn_imports == 1
    assert not _flash_lines(caplog)
    del builtins.flash_attn_imports


# -- float32 where the ranking is decided ---------------------------------------------------------


def test_attention_mass_of_bf16_queries_and_keys_is_the_float32_one(monkeypatch):
    """The path a GPU takes (the CPU kernel off): q.k^T accumulated in float32, not rounded to bf16
    before the exp (which moves every probability by up to ~2^-8 of its score)."""
    from sparsespec.kernels import cpu_attention
    from sparsespec.kv import capture

    monkeypatch.setattr(cpu_attention, "applies", lambda *args, **kwargs: False)
    monkeypatch.setattr(capture, "KEY_CHUNK", 64)  # the chunked upcast, as for a long cache
    g = torch.Generator().manual_seed(0)
    hq, hkv, c, total, d = 8, 2, 5, 300, 64
    q = (3 * torch.randn(hq, c, d, generator=g)).bfloat16()
    k = torch.randn(hkv, total, d, generator=g).bfloat16()
    scale = d ** -0.5
    s = (q.float().reshape(hkv, 4 * c, d) @ k.float().transpose(1, 2)).view(hkv, 4, c, total) * scale
    s = s.masked_fill(~capture.causal_block_mask(c, total)[None, None], float("-inf"))
    lse = torch.logsumexp(s, -1).reshape(hq, c)
    want = torch.softmax(s, -1).sum(1)
    got = capture.attention_mass(q, lse, k, scale)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_bf16_logits_are_float32_products_and_the_fallback_is_said_once(caplog):
    from sparsespec import precision

    precision._NO_OUT_DTYPE.discard("cpu")  # learnt anew in this test
    lm = tiny_lm()
    lm.lm_head.to(torch.bfloat16)
    h = torch.randn(3, lm.lm_head.in_features, generator=torch.Generator().manual_seed(1)).bfloat16().to(lm.device)
    with caplog.at_level("INFO", logger="sparsespec.precision"):
        outs = [lm._logits(h) for _ in range(3)]
    want = torch.nn.functional.linear(h.float(), lm.lm_head.weight.float())
    for out in outs:
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, want)
    lines = [r.getMessage() for r in caplog.records]
    if DEVICE.type == "cpu":
        assert len(lines) == 1 and lines[0].startswith("the lm_head's float32 logits: no float32-output")


# -- the masked path: one fused call, no repeated K/V ----------------------------------------------


@pytest.mark.parametrize("lse_rows", [0, 3])
def test_masked_prefill_chunk_folds_the_group_into_rows_and_equals_the_reference(monkeypatch, lse_rows):
    """A sparse view's mask over a prefill chunk (more rows than a decode step): SDPA gets as many
    query heads as KV heads (no enable_gqa, which with a mask repeats K/V in the math backend), and
    the output is the plain masked attention of every query head."""
    import torch.nn.functional as F

    from sparsespec.models import attention

    calls = []
    real = F.scaled_dot_product_attention

    def sdpa(q, k, v, **kw):
        calls.append((q.shape[-3], k.shape[-3], kw.get("enable_gqa", False), kw.get("attn_mask") is not None))
        return real(q, k, v, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", sdpa)
    g = torch.Generator().manual_seed(3)
    hq, hkv, n, total, d = 8, 2, attention.SMALL_QUERY_BLOCK + 36, 300, 16
    q, k, v = (torch.randn(*s, generator=g).to(DEVICE) for s in ((hq, n, d), (hkv, total, d), (hkv, total, d)))
    mask = (torch.rand(n, total, generator=g) > 0.4).to(DEVICE)
    mask[:, 0] = True  # every row sees a key
    out, lse = attention.attend(q, k, v, 0.25, mask=mask, lse_rows=lse_rows)
    assert calls == [(hkv, hkv, False, True)]
    kr, vr = k.repeat_interleave(hq // hkv, 0), v.repeat_interleave(hq // hkv, 0)
    s = (q @ kr.transpose(1, 2) * 0.25).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(out, torch.softmax(s, -1) @ vr, rtol=1e-5, atol=1e-5)
    if lse_rows:
        torch.testing.assert_close(lse, torch.logsumexp(s[:, n - lse_rows :], -1))


# -- prompt lookup: its host draft is copied once, without a wait ----------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_lookup_round_copies_its_host_draft_once_and_never_reads_it_back(monkeypatch, temperature):
    from syncs import SyncCounter

    from sparsespec.decoding import verify
    from sparsespec.decoding.drafters import PromptLookup
    from sparsespec.decoding.sampling import Sampling

    copies = []
    for module in (engine_module, drafters_module):
        real = module.to_device_ids
        monkeypatch.setattr(module, "to_device_ids", lambda ids, dev, real=real: copies.append(ids) or real(ids, dev))
    decided = []
    real_accept = verify.accept_greedy_many
    monkeypatch.setattr(engine_module, "accept_greedy_many",
                        lambda drafts, logits: decided.append(drafts) or real_accept(drafts, logits))
    target = tiny_lm()
    prompt = random_prompt(150, seed=3)
    sampling = Sampling(temperature=temperature)
    ar = SpeculativeEngine(target).generate(prompt, 30, sampling, seed=1)
    copies.clear()
    lookup = PromptLookup(1)
    with SyncCounter(DEVICE) as syncs:
        res = SpeculativeEngine(target, None, FixedK(4), prompt_lookup=lookup).generate(prompt, 30, sampling, seed=1)
    assert lookup.looked_up > 0 and res.drafted > 0
    if temperature == 0.0:
        assert res.output_ids == ar.output_ids
        assert all(isinstance(d, list) for drafts in decided for d in drafts)  # decided on the host copy
        assert len(copies) == res.verify_steps  # one copy per round: [pending, *draft]
        if DEVICE.type == "cuda":  # a pageable copy waits too; on the CPU the lookup's host reads count
            assert syncs.count <= res.verify_steps + 1, syncs.names
    else:  # and the one-hot q of each copied draft, through the same non-blocking copy
        assert len(copies) == res.verify_steps + lookup.looked_up


# -- on a GPU (scripts/gpu_check.sh runs these with SPARSESPEC_TEST_DEVICE=cuda) -------------------


@cuda_only
def test_cuda_rounds_read_their_events_and_stay_exact():
    """Real CUDA events: every round's span is read after its end event completed, for 60 rounds."""
    target = tiny_lm()
    prompt = random_prompt(200, seed=5)
    ar = SpeculativeEngine(target).generate(prompt, 60).output_ids
    res = SpeculativeEngine(target, SelfDrafter(RecallIndex(ratio=0.1, k_sink=2, k_recent=4)),
                            EntropyController()).generate(prompt, 60)
    assert res.output_ids == ar and res.verify_s > 0 and res.extra["index_update_s"] > 0


@cuda_only
def test_cuda_bf16_attention_mass_and_logits_are_float32_products(caplog):
    from sparsespec.kv import capture

    g = torch.Generator().manual_seed(0)
    q = (3 * torch.randn(8, 5, 64, generator=g)).to(DEVICE, torch.bfloat16)
    k = torch.randn(2, 4096, 64, generator=g).to(DEVICE, torch.bfloat16)
    s = (q.float().reshape(2, 20, 64) @ k.float().transpose(1, 2)).view(2, 4, 5, 4096) * 0.125
    s = s.masked_fill(~capture.causal_block_mask(5, 4096, DEVICE)[None, None], float("-inf"))
    lse = torch.logsumexp(s, -1).reshape(8, 5)
    torch.testing.assert_close(capture.attention_mass(q, lse, k, 0.125), torch.softmax(s, -1).sum(1),
                               rtol=1e-4, atol=1e-6)
    lm = tiny_lm()
    lm.lm_head.to(torch.bfloat16)
    with caplog.at_level("INFO", logger="sparsespec.precision"):
        lm._logits(torch.randn(3, lm.lm_head.in_features, device=DEVICE, dtype=torch.bfloat16))
    assert not caplog.records  # CUDA has the float32-output kernel: no upcast of the weight


@cuda_only
def test_cuda_masked_path_runs_without_the_math_kernel():
    """The folded masked call is one a fused SDPA kernel takes (the math one, which repeats K/V for
    GQA, is switched off here)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from sparsespec.models import attention

    g = torch.Generator().manual_seed(3)
    n, total = attention.SMALL_QUERY_BLOCK + 36, 1000
    q = torch.randn(32, n, 128, generator=g).to(DEVICE, torch.bfloat16)
    k, v = (torch.randn(8, total, 128, generator=g).to(DEVICE, torch.bfloat16) for _ in range(2))
    mask = (torch.rand(n, total, generator=g) > 0.3).to(DEVICE)
    mask[:, 0] = True
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        out, _ = attention.attend(q, k, v, 128**-0.5, mask=mask)
    kr, vr = k.float().repeat_interleave(4, 0), v.float().repeat_interleave(4, 0)
    s = (q.float() @ kr.transpose(1, 2) * 128**-0.5).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(out.float(), torch.softmax(s, -1) @ vr, rtol=2e-2, atol=2e-2)


@cuda_only
def test_cuda_flash_attn_where_installed_aligns_the_verification_block_to_the_end():
    from sparsespec.kv.capture import causal_block_mask
    from sparsespec.models import attention

    if not attention.flash_attn_applies(DEVICE, torch.bfloat16):
        pytest.skip("flash-attn is not installed here (or not usable: logged once)")
    g = torch.Generator().manual_seed(4)
    q = torch.randn(32, 5, 128, generator=g).to(DEVICE, torch.bfloat16)
    k, v = (torch.randn(8, 2000, 128, generator=g).to(DEVICE, torch.bfloat16) for _ in range(2))
    out, _ = attention.attend(q, k, v, 128**-0.5)
    kr, vr = k.float().repeat_interleave(4, 0), v.float().repeat_interleave(4, 0)
    s = (q.float() @ kr.transpose(1, 2) * 128**-0.5).masked_fill(~causal_block_mask(5, 2000, DEVICE), float("-inf"))
    torch.testing.assert_close(out.float(), torch.softmax(s, -1) @ vr, rtol=2e-2, atol=2e-2)


def test_flash_attn_that_fails_on_its_first_call_is_said_once_and_pytorch_serves(stand_in, caplog, monkeypatch):
    """A build that imports but cannot run on this GPU: the first call fails, PyTorch's path answers
    it and every later one, with one logged line."""
    from sparsespec.kernels import cpu_attention
    from sparsespec.models import attention

    monkeypatch.setattr(cpu_attention, "applies", lambda *args, **kwargs: False)  # the path a GPU takes
    stand_in("__version__ = '2.6.3'\ncalls = []\ndef flash_attn_func(*a, **k):\n    calls.append(1)\n"
             "    raise RuntimeError('FlashAttention only supports Ampere GPUs or newer.')\n")
    monkeypatch.setattr(attention, "_flash_attn_failed", [])
    real = attention.flash_attn_applies
    # the CPU tensors below stand in for CUDA ones: only the device check is bypassed
    monkeypatch.setattr(attention, "flash_attn_applies",
                        lambda device, dtype: real(torch.device("cuda"), torch.bfloat16))
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(4, 3, 16, generator=g), torch.randn(2, 40, 16, generator=g), torch.randn(2, 40, 16, generator=g)
    want, _ = attention._attend_reference(q, k, v, 0.25, None)
    for _ in range(3):
        out, _ = attention.attend(q, k, v, 0.25)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    import flash_attn

    assert len(flash_attn.calls) == 1
    lines = _flash_lines(caplog)
    assert len(lines) == 1 and "Ampere" in lines[0] and "PyTorch's attention" in lines[0]


@cuda_only
def test_cuda_model_fingerprint_and_teacher_targets_match_the_host():
    """The teacher's cache key and targets of a model on the GPU are the host's (in float32)."""
    from conftest import tiny_hf

    from sparsespec.training.teacher import Teacher, model_fingerprint

    on_gpu = tiny_hf()
    on_host = tiny_hf().cpu()
    assert model_fingerprint(on_gpu) == model_fingerprint(on_host)
    ids = torch.randint(on_host.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    got, want = Teacher(on_gpu, "float32", topk=4)(ids), Teacher(on_host, "float32", topk=4)(ids)
    # the GPU's float32 sums round differently: a near-tie may flip, a wholesale difference may not
    assert (got["targets"] == want["targets"]).float().mean() > 0.95
    assert (got["topk_logp"][..., 0] - want["topk_logp"][..., 0]).abs().max() < 1e-3

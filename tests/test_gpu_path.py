"""The CUDA path's logic, checked on the CPU with stand-ins: CUDA events that complete late, flash-attn
modules that are too old or fail to import, bfloat16 inputs against float32 references, parameters
that live off the host. What only a GPU can show is in the CUDA-only tests at the end (run by
scripts/gpu_check.sh on a GPU machine)."""

from __future__ import annotations

import pytest
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

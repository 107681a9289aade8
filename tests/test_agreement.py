"""sparsespec.experiments.common.agreement: the logits of spans after a long prefix under a KV view, computed
from only what reaches the spans, equal the whole prefix's."""

import pytest
import torch
from conftest import random_prompt, tiny_lm

from sparsespec.kv.policies import FullKV, StreamingKV


@pytest.mark.parametrize("view", [StreamingKV(budget=24, k_sink=4), StreamingKV(ratio=0.1, k_sink=4), FullKV()],
                         ids=["budget", "ratio", "full"])
def test_span_logits_read_only_what_reaches_the_spans_and_equal_the_whole_prefix(view):
    from sparsespec.experiments.common.agreement import reach, span_logits

    lm, ids = tiny_lm("qwen2", layers=2), random_prompt(1400, seed=3)
    prefix, spans = ids[:1300], [ids[1300:1340], ids[1340:1400]]
    got = span_logits(lm.hf, prefix, spans, view)
    for span, logits in zip(spans, got, strict=True):
        seq = prefix + span
        ref = lm.forward(seq, lm.new_cache(len(seq)), mask=view.mask(0, len(seq), len(seq)))[1300:]
        torch.testing.assert_close(logits, ref, atol=5e-5, rtol=1e-4)  # summation order only
    # two layers back: 1300 - 2 x 20 recent (budget); 1300 - 126, then 1174 - 114 (ratio); full reads all
    expect = 0 if isinstance(view, FullKV) else 1260 if view.budget else 1060
    assert reach(view, 2, 1300) == expect

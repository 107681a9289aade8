"""Rows carry the planner's prediction made before the run (planned_speedup), beside the measured
speedup, and the summary shows both."""
from types import SimpleNamespace

import torch
from transformers import LlamaConfig

from sparsespec.config import load_method
from sparsespec.eval.harness import planned_speedup
from sparsespec.eval.summary import summarize, to_markdown

SMOLLM2 = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192)


def _target(device: str = "cpu", dtype=torch.float32):
    return SimpleNamespace(config=SMOLLM2, device=torch.device(device), dtype=dtype)


def test_a_self_drafting_method_is_planned_and_ar_is_not():
    sparse = planned_speedup(load_method("sparsespec_l"), _target(), 16384, 1)
    quantized = planned_speedup(load_method("sparsespec_l_q"), _target(), 16384, 1)
    assert sparse is not None and quantized is not None and 0 < sparse < quantized  # fewer bytes a draft step
    assert planned_speedup(load_method("ar"), _target(), 16384, 1) is None


def test_no_plan_where_the_device_has_no_measured_profile():
    assert planned_speedup(load_method("sparsespec_l"), _target("meta"), 16384, 1) is None


def test_the_summary_shows_the_planned_speedup_beside_the_measured_one():
    base = {"dataset": "pg19", "ctx": 16384, "sample_id": "a", "tokens_per_s": 10.0, "wall_s": 1.0,
            "acceptance_rate": 0.9, "mean_accepted_tokens": 4.0, "gamma": 0.3, "k_mean": 4.0,
            "predicted_speedup": 1.4, "score": None, "exact_match_ar": True, "new_tokens": 64}
    rows = [{**base, "method": "ar"}, {**base, "method": "sparsespec_l", "speedup": 1.1, "planned_speedup": 1.25}]
    table = to_markdown(summarize(rows))
    assert "planned S" in table.splitlines()[0] and "| 1.25 |" in table.splitlines()[3]

"""Loading holds the weights once: the peak resident memory of loading a model and preparing it for
decoding (the runner's fused projections) stays within the weights and 20%, on top of what the
process held after its imports. Measured in a fresh process (the peak is per process), Linux only."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import tiny_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

pytestmark = [pytest.mark.slow,  # a fresh process measures its own peak
              pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads Linux's /proc peak memory")]

# the layers dominate, as in real models (fusing their projections is where copies would pile up), and
# there are enough of them that one layer's transient while it is fused is a small share, as in real models
SHAPE = dict(vocab_size=4096, hidden_size=384, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)

PROBE = textwrap.dedent("""
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    from sparsespec.models.loading import load_model
    from sparsespec.models.runner import CausalLM

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    # the runtime's own memory: every import and a first (tiny) model of the family built
    CausalLM(AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8,
             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)))
    open("/proc/self/clear_refs", "w").write("5")  # resets the peak to the current size
    base = status("VmRSS")
    lm = CausalLM(load_model(sys.argv[1], dtype="float32", device="cpu").model)
    touched = sum(float(p.sum()) for p in lm.hf.parameters())  # every page of every weight read
    weights = sum(p.numel() * p.element_size() for p in lm.hf.parameters())
    print(json.dumps({"base": base, "peak": status("VmHWM"), "weights": weights}))
""")


def test_loading_and_fusing_hold_the_weights_once(tmp_path):
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**SHAPE)).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    proc = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads(proc.stdout.strip().splitlines()[-1])
    extra = (m["peak"] - m["base"]) / m["weights"]
    assert extra <= 1.2, f"loading peaked at {extra:.2f}x the weights above the imports"

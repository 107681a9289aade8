"""A user's own KV policy and method, outside the package: the worked example of
docs/architecture.md, written to a temporary folder exactly as the doc shows it, runs through
evaluate.py and the Python API and gives ar's output."""

import json
import subprocess
import sys
from pathlib import Path

import helpers
import pytest
import torch
from helpers import ROOT, base_overrides, sub_env

import sparsespec
from sparsespec.config import ConfigError
from sparsespec.eval.methods import MethodConfigError
from sparsespec.kv.policies import KVPolicyError

DOC = ROOT / "docs" / "architecture.md"


def write_doc_examples(folder: Path) -> dict[str, Path]:
    """Every ```block``` the doc marks with `<!-- example: PATH -->`, written to folder/PATH."""
    return helpers.write_doc_examples(DOC, folder, {"my_parts/key_norm.py", "my_conf/method/key_norm.yaml"})


@pytest.mark.slow  # starts evaluate.py (or a script) in its own process
def test_a_users_kv_policy_runs_from_the_command_line_and_is_exact(harness_env, tmp_path):
    write_doc_examples(tmp_path)
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "evaluate.py"), *base_overrides(harness_env, out, "limit=2"),
           f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "method=[ar,key_norm]", "method.drafter.policy.ratio=0.2"]
    proc = subprocess.run(cmd, cwd=ROOT, env={**sub_env(tmp_path), "PYTHONPATH": str(tmp_path / "my_parts")},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    mine = [r for r in rows if r["method"] == "key_norm"]
    assert len(mine) == 2 and all(r["exact_match_ar"] for r in mine)
    assert all(r["view"] == "KeyNorm" and r["drafted_per_round"] for r in mine)  # it really drafted
    assert mine[0]["method_config"]["drafter"]["policy"]["ratio"] == 0.2
    assert any(r["acceptance_rate"] < 1 for r in mine)  # a sparse view: some drafts rejected


def test_a_users_kv_policy_through_the_python_api(harness_env, tmp_path, monkeypatch):
    write_doc_examples(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "my_parts"))
    pipe = sparsespec.pipeline("key_norm", model=str(harness_env["model"]), config_dir=tmp_path / "my_conf",
                                drafter__policy__ratio=0.2, device="cpu")
    ar = sparsespec.pipeline("ar", model=str(harness_env["model"]))
    assert pipe.target.device.type == "cpu" and pipe.target.dtype == ar.target.dtype == torch.float32
    prompt = list(range(2, 300))
    streamed = []
    out = pipe.generate(prompt, max_new_tokens=24, on_token=streamed.append, stop_at_eos=False)
    assert out.output_ids == ar.generate(prompt, max_new_tokens=24, stop_at_eos=False).output_ids
    assert streamed == out.output_ids and len(out.output_ids) == 24 and out.acceptance_rate is not None
    # a list of prompts is one batch: an output per prompt, each the one it gets alone
    other = list(range(40, 250))
    got = []
    outs = pipe.generate([prompt, other], max_new_tokens=24, stop_at_eos=False, on_token=lambda i, t: got.append(i))
    assert [o.output_ids for o in outs] == [out.output_ids, ar.generate(other, 24, stop_at_eos=False).output_ids]
    assert outs[0].result.batch_size == 2 and sorted(set(got)) == [0, 1] and len(got) == 48


def test_a_policy_whose_score_has_the_wrong_shape_is_named(harness_env, tmp_path, monkeypatch):
    paths = write_doc_examples(tmp_path)
    text = paths["my_parts/key_norm.py"].read_text()
    paths["my_parts/key_norm.py"].write_text(text.replace("for k in cache.k])", "for k in cache.k])[:, :1]"))
    monkeypatch.syspath_prepend(str(tmp_path / "my_parts"))
    sys.modules.pop("key_norm", None)
    pipe = sparsespec.pipeline("key_norm", model=str(harness_env["model"]), config_dir=tmp_path / "my_conf")
    with pytest.raises(KVPolicyError, match=r"KeyNorm.score returned shape .*expected \[layers, kv_heads, length\]"):
        pipe.generate(list(range(2, 300)), max_new_tokens=8)
    sys.modules.pop("key_norm", None)


def test_pipeline_bad_names_say_what_to_fix(harness_env):
    with pytest.raises(ConfigError, match="method/nosuch"):
        sparsespec.pipeline("nosuch", model=str(harness_env["model"]))
    with pytest.raises(ConfigError, match="method.drafter.policy.ratio=2"):
        sparsespec.pipeline("magicdec", model=str(harness_env["model"]), drafter__policy__ratio=2)
    with pytest.raises(MethodConfigError, match="drafter=DIR"):
        sparsespec.pipeline("sd", model=str(harness_env["model"]))
    with pytest.raises(ConfigError, match=r"model.device=cuda:99: (CUDA is not available|this machine has)"):
        sparsespec.pipeline("ar", model=str(harness_env["model"]), device="cuda:99")
    with pytest.raises(ConfigError, match=r"model.device='gpu': expected auto, cpu, cuda or cuda:N"):
        sparsespec.pipeline("ar", model=str(harness_env["model"]), device="gpu")


def test_a_parts_setting_error_is_named_at_the_key_the_user_set(tmp_path, monkeypatch):
    """A part raises SettingError(its field, value, reason); the method re-raises it at the field's
    full key, from the error's own fields."""
    from sparsespec.eval.methods import Method

    (tmp_path / "wide_policy.py").write_text(
        "from dataclasses import dataclass\n\nfrom sparsespec.checks import require\n"
        "from sparsespec.kv.policies import StreamingKV\n\n\n@dataclass\nclass Wide(StreamingKV):\n"
        "    width: int = 2\n\n    def __post_init__(self):\n        super().__post_init__()\n"
        "        require(self.width > 0, 'width', self.width, 'a positive number of columns')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    node = {"name": "wide", "drafter": {"_target_": "sparsespec.decoding.drafters.SelfDrafter",
                                        "policy": {"_target_": "wide_policy.Wide", "width": 0}}}
    with pytest.raises(MethodConfigError) as e:
        Method.from_config(node)
    assert str(e.value) == ("method wide: method.drafter.policy.width=0 is out of range: allowed a positive number "
                            "of columns")
    node["drafter"]["policy"]["width"] = 3
    assert Method.from_config(node).policy().width == 3
    sys.modules.pop("wide_policy", None)


def test_a_users_policy_setting_error_reaches_evaluate_at_its_key_without_parsing_text(tmp_path, monkeypatch):
    """A user's policy raising SettingError("budget", 0, ...) in its __post_init__ is reported by
    load_method and by evaluate.py's run (the error it logs before exiting with status 2) at
    method.drafter.policy.budget, from the error's fields: no message is parsed for a key any more."""
    import pickle

    import sparsespec.eval.methods as methods
    from sparsespec.checks import SettingError
    from sparsespec.config import load_method
    from sparsespec.eval.cli import compose_run, run
    from sparsespec.eval.settings import EvaluationError
    from sparsespec.kv.policies import KVPolicySettingError

    assert not hasattr(methods, "_plain_at")
    (tmp_path / "blocks_policy.py").write_text(
        "from dataclasses import dataclass\n\nfrom sparsespec.checks import SettingError\n"
        "from sparsespec.kv.policies import KVPolicy\n\n\n@dataclass\nclass Blocks(KVPolicy):\n"
        "    def __post_init__(self):\n        if self.budget is not None and self.budget < 64:\n"
        "            raise SettingError('budget', self.budget, 'is out of range: Blocks keeps whole blocks of 64 "
        "tokens')\n        super().__post_init__()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["method=magicdec", "method.drafter.policy._target_=blocks_policy.Blocks", "method.drafter.policy.budget=0"]
    line = "method.drafter.policy.budget=0 is out of range: Blocks keeps whole blocks of 64 tokens"
    with pytest.raises(ConfigError) as e:
        load_method("magicdec", args[1:])
    assert str(e.value) == f"method magicdec: {line}"
    with pytest.raises(EvaluationError) as e:  # what evaluate.py logs before it exits with status 2
        run(compose_run([*args, f"out_dir={tmp_path / 'out'}"]))
    assert str(e.value).endswith(line) and not (tmp_path / "out").exists()
    # a plain error names the part's node; its text is left as the part wrote it
    (tmp_path / "plain_policy.py").write_text(
        "from dataclasses import dataclass\n\nfrom sparsespec.kv.policies import KVPolicy\n\n\n@dataclass\n"
        "class Plain(KVPolicy):\n    def __post_init__(self):\n        raise ValueError('budget=0: too small')\n")
    with pytest.raises(ConfigError) as e:
        load_method("magicdec", ["method.drafter.policy._target_=plain_policy.Plain"])
    assert str(e.value) == "method magicdec: method.drafter.policy: budget=0: too small"
    # a shipped policy's error keeps its class through .at() and pickling (a worker's error reaches its parent)
    err = pickle.loads(pickle.dumps(KVPolicySettingError("budget", 0, "is out of range").at("method.drafter.policy")))
    assert type(err) is KVPolicySettingError and isinstance(err, SettingError)
    assert str(err) == "method.drafter.policy.budget=0 is out of range"
    for name in ("blocks_policy", "plain_policy"):
        sys.modules.pop(name, None)

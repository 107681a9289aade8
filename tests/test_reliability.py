"""Reliability (config / training / engine side): typed configs that fail before any model loads,
train.py resume with the same data order, a teacher cache that is never read damaged, determinism
of decoding and training, hostile inputs (a drafter with another vocabulary, sweep values of the
wrong type). The soak study's smoke run is tests/test_soak.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import random_prompt, tiny_hf
from helpers import ROOT, compose_cfg, overrides, run_python, tiny_target
from helpers import text as _text
from lightning.pytorch.callbacks import Callback
from transformers import LlamaConfig, LlamaForCausalLM

from sparsespec.config import ConfigError, register_configs, validate_evaluate_config, validate_train_config
from sparsespec.decoding.drafters import ModelDrafter
from sparsespec.decoding.sampling import Sampling
from sparsespec.kv.policies import StreamingKV
from sparsespec.models.runner import CausalLM
from sparsespec.training.data import DraftDataModule, ResumableLoader
from sparsespec.training.teacher import Teacher, TeacherCacheError, model_fingerprint

register_configs()
pytestmark = pytest.mark.usefixtures("isolated")


@pytest.fixture
def env(training_env):
    return training_env


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test: validation must come first."""
    import sparsespec.models.loading as loading

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the config was validated")

    monkeypatch.setattr(loading, "load_model", boom)


# ---------------------------------------------------------------------------------------------
# 1. typed configs: evaluate.py
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ovr", [f"method={p.stem}" for p in sorted((ROOT / "conf/method").glob("*.yaml"))]
                         + [f"dataset={d}" for d in ("pg19", "text", "ruler", "longbench", "longbench_v2",
                                                     "infinitebench")] + ["logger=wandb"])
def test_shipped_evaluate_configs_validate(ovr):
    # guards the schema against drift: every shipped method, dataset and logger config passes
    validate_evaluate_config(compose_cfg("evaluate", [ovr]))


EVAL_BAD = [
    (["method.drafter.policy.ratio=1.5"], "method.drafter.policy.ratio", "(0, 1]"),
    (["method.drafter.policy.ratio=0"], "method.drafter.policy.ratio", "(0, 1]"),
    (["method=magicdec", "method.drafter.policy.budget=8"], "method.drafter.policy.budget", "k_sink + k_recent"),
    (["method.drafter.policy.budget=70"], "method.drafter.policy.budget", "k_sink + k_recent = 80"),
    (["method=magicdec", "method.controller.k=0"], "method.controller.k=0", "positive"),
    (["method=lookup", "method.controller.k=-1"], "method.controller.k=-1", "positive"),
    (["method.drafter.policy.window=0"], "method.drafter.policy.window=0", "a positive integer"),
    (["method.drafter.policy.refresh_every=0"], "method.drafter.policy.refresh_every=0", "a positive integer"),
    (["method.lookup=-2"], "method.lookup=-2", ">= 1, or 0"),
    (["method.controller.beta=1.0"], "method.controller.beta=1.0", "[0, 1)"),
    (["method.controller.candidates=[]"], "method.controller.candidates=[]", "positive draft lengths"),
    (["method.drafter.policy._target_=nosuch.Policy"], "method.drafter.policy._target_='nosuch.Policy'",
     "cannot be imported"),
    (["method=sd_recall", "method.drafter.policy.budget=40"], "budget=40", "smaller than k_sink + k_recent"),
    (["gen.temperature=-0.5"], "gen.temperature", ">= 0"),
    (["gen.top_p=0"], "gen.top_p", "(0, 1]"),
    (["gen.top_p=1.01"], "gen.top_p", "(0, 1]"),
    (["gen.max_new_tokens=0"], "gen.max_new_tokens", "> 0"),
    (["gen.temperature=hot"], "gen.temperature", "Float"),
    (["gen.max_new_tokens=1.5"], "gen.max_new_tokens", "Integer"),
    (["+gen.temprature=0.5"], "gen.temprature", "did you mean temperature"),
    (["+model.dtyp=float16"], "model.dtyp", "dtype"),
    (["model.dtype=float8"], "model.dtype", "float32, bfloat16, float16"),
    (["drafter.dtype=int4"], "drafter.dtype", "float32, bfloat16, float16"),
    (["model.device=gpu"], "model.device", "auto, cpu, cuda or cuda:N"),
    (["dataset.name=pg91"], "dataset.name", "pg19"),
    (["dataset=ruler", "+dataset.options.dept=0.5"], "dataset.options.dept", "depth"),
    (["ctx=lots"], "ctx", "4k"),
    (["limit=0"], "limit", "> 0"),
    (["baseline=sd"], "baseline", "ar"),
    (["runtime.prefill_chunk=0"], "runtime.prefill_chunk", "> 0"),
    (["shard=2/2"], "shard='2/2'", "i/n with 0 <= i < n"),
    (["shard=abc"], "shard='abc'", "i/n with 0 <= i < n"),
    (["shard=0/0"], "shard='0/0'", "i/n with 0 <= i < n"),
]


@pytest.mark.parametrize("ovr,key,allowed", EVAL_BAD, ids=[" ".join(c[0]) for c in EVAL_BAD])
def test_evaluate_config_errors_name_the_key(ovr, key, allowed):
    cfg = compose_cfg("evaluate", ovr)
    with pytest.raises(ConfigError) as e:
        validate_evaluate_config(cfg)
    assert key in str(e.value) and allowed in str(e.value), str(e.value)


@pytest.mark.parametrize("ovr,key", [(["method=ar", "method.ratio=0.5"], "ratio"),
                                     (["method.controler.k=2"], "controler"), (["method/controller=greedy"], "greedy"),
                                     (["gen.temprature=1"], "gen.temprature")])
def test_evaluate_compose_rejects_unknown_keys_and_types(ovr, key):
    # the method schema (ConfigStore) and Hydra's struct mode reject these while composing
    with pytest.raises(Exception) as e:
        compose_cfg("evaluate", ovr)
    chain, exc = [], e.value
    while exc is not None:
        chain.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    assert key in " ".join(chain)


# ---------------------------------------------------------------------------------------------
# 1. typed configs: train.py (validated at the top of training.run.train, before any model loads)
# ---------------------------------------------------------------------------------------------


TRAIN_BAD = [
    (["trainer.max_steps=abc"], "trainer.max_steps", "integer"),
    (["trainer.max_steps=0"], "trainer.max_steps", "-1"),
    (["+trainer.max_step=3"], "trainer.max_step", "did you mean max_steps"),
    (["trainer.precision=bf17"], "trainer.precision", "bf16-mixed"),
    (["optim.lr=0"], "optim.lr", "> 0"),
    (["optim.lr=fast"], "optim.lr", "Float"),
    (["+optim.lrr=0.1"], "optim.lrr", "did you mean lr"),
    (["corpus.seq_len=0"], "corpus.seq_len", "> 0"),
    (["corpus.seq_len=-64"], "corpus.seq_len", "> 0"),
    (["loss.kl=-1"], "loss.kl", ">= 0"),
    (["loss.ce=0", "loss.acc=0", "loss.sparse_ce=0", "loss.kl=0"], "loss weights", "at least one"),
    (["budget.values=[0,32]"], "budget.values", "> budget.k_sink"),
    (["budget.values=[-16]"], "budget.values", "> budget.k_sink"),
    (["budget.probs=[0.5,0.2]"], "budget.probs", "sum to 1"),
    (["budget.probs=[1.0]"], "budget.probs", "one probability per budget"),
    (["budget.ratios=[0.25,1.5]"], "budget.ratios", "(0, 1]"),
    (["budget.mode=sometimes"], "budget.mode", "multi, single or full"),
    (["teacher.dtype=fp8"], "teacher.dtype", "float32, bfloat16, float16"),
    (["teacher.on_policy_tokens=64"], "teacher.on_policy_tokens", "fewer than corpus.seq_len=64"),
    (["teacher.on_policy_tokens=-1"], "teacher.on_policy_tokens", ">= 0"),
    (["model.dtype=half"], "model.dtype", "float32, bfloat16, float16"),
    (["model.device=tpu"], "model.device", "auto, cpu, cuda or cuda:N"),
    (["drafter.kind=big"], "drafter.kind", "truncated, small"),
    (["drafter.n_layers=0"], "drafter.n_layers", "> 0"),
    (["ckpt_path=/no/such/last.ckpt"], "ckpt_path", "last.ckpt"),
]


@pytest.mark.parametrize("extra,key,allowed", TRAIN_BAD, ids=[" ".join(c[0]) for c in TRAIN_BAD])
def test_train_config_errors_before_any_model_loads(env, tmp_path, no_model_load, extra, key, allowed):
    from sparsespec.training.run import train

    cfg = compose_cfg("train", overrides(env, tmp_path / "out", *extra))
    with pytest.raises(ConfigError) as e:
        train(cfg)
    assert key in str(e.value) and allowed in str(e.value), str(e.value)


@pytest.mark.parametrize("group", ["budget=multi", "budget=single", "budget=full", "drafter=small", "loss=ce",
                                   "trainer=debug", "trainer=ddp", "trainer=fsdp", "logger=wandb",
                                   "experiment=quick", "budget.probs=[0.25,0.25,0.25,0.25]"])
def test_shipped_train_configs_validate(group):
    validate_train_config(compose_cfg("train", [group]))


@pytest.mark.slow
def test_sweep_values_of_the_wrong_type_exit_nonzero(tmp_path):
    # the flat key=value form a W&B agent passes, through the real entry points
    r = run_python([str(ROOT / "train.py"), "trainer.max_steps=abc", f"out_dir={tmp_path / 't'}"], tmp_path)
    assert r.returncode != 0 and "trainer.max_steps" in r.stderr + r.stdout
    assert not (tmp_path / "t" / "checkpoints").exists()
    r = run_python([str(ROOT / "evaluate.py"), "method.drafter.policy.ratio=high", f"out_dir={tmp_path / 'e'}"], tmp_path)
    assert r.returncode != 0 and "method.drafter.policy.ratio" in r.stderr + r.stdout
    assert not (tmp_path / "e").exists()
    # a part the method does not have (ar has no drafter): one line naming the key, exit 2
    r = run_python([str(ROOT / "evaluate.py"), "method=ar", "method.drafter.policy.ratio=0.5", f"out_dir={tmp_path / 'a'}"],
             tmp_path)
    assert r.returncode == 2 and "method.drafter.policy.ratio=0.5: ar has no such key" in r.stderr + r.stdout
    assert "Traceback" not in r.stderr + r.stdout and not (tmp_path / "a").exists()


# ---------------------------------------------------------------------------------------------
# 4. hostile inputs: a drafter with another vocabulary
# ---------------------------------------------------------------------------------------------


def _foreign_drafter_dir(env, root: Path) -> Path:
    """A drafter whose tokenizer maps strings to other ids, at the target's vocabulary size (so only
    a tokenizer comparison can tell)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = "zebra quantum violin marble thunder orchid lantern copper meadow falcon".split()
    texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(400)) for i in range(5)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>", "<s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    foreign = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    assert foreign.get_vocab() != env["tok"].get_vocab()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=env["target"].config.vocab_size, hidden_size=64, intermediate_size=96,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True)
    d = root / "foreign_drafter"
    LlamaForCausalLM(cfg).save_pretrained(d)
    foreign.save_pretrained(d)
    return d


def test_train_rejects_a_drafter_with_another_vocabulary(env, tmp_path, no_model_load):
    from sparsespec.training.run import train

    d = _foreign_drafter_dir(env, tmp_path)
    cfg = compose_cfg("train", overrides(env, tmp_path / "out", f"drafter.path={d}"))
    with pytest.raises(ConfigError) as e:
        train(cfg)
    assert f"drafter.path={d}" in str(e.value) and "tokenizer differs" in str(e.value)


def test_evaluate_rejects_a_drafter_with_another_vocabulary(env, tmp_path):
    from sparsespec.eval.harness import EvaluationError, run_evaluation

    d = _foreign_drafter_dir(env, tmp_path)
    text = tmp_path / "doc.txt"
    text.write_text(_text(5, 400))
    out = tmp_path / "eval_out"
    cfg = compose_cfg("evaluate", [f"model.path={env['model_dir']}", "method=sd", f"drafter.path={d}", "dataset=text",
                                   f"dataset.path={text}", "dataset.use_chat_template=false", "ctx=128",
                                   "gen.max_new_tokens=4", f"out_dir={out}", "runtime.warmup=false",
                                   "runtime.progress=false", "baseline=null"])
    validate_evaluate_config(cfg)  # the config itself is fine
    with pytest.raises(EvaluationError) as e:
        run_evaluation(cfg)
    assert "drafter.path" in str(e.value) and "tokenizer" in str(e.value)
    assert not out.exists()  # no partial output


# ---------------------------------------------------------------------------------------------
# 2. train.py resume: same data order, same budgets, same losses
# ---------------------------------------------------------------------------------------------


class Record(Callback):
    """Per optimizer step: the batch's token ids, the budgets drawn and the loss."""

    def __init__(self, crash_after: int | None = None):
        self.steps: dict[int, tuple] = {}
        self.crash_after = crash_after

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.crash_after is not None and trainer.global_step >= self.crash_after:
            raise RuntimeError("simulated kill")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.steps[trainer.global_step] = (batch["input_ids"].tolist(), list(pl_module.last_budgets),
                                           float(loss.detach()))


def _train(env, out: Path, *extra: str, callbacks=()):
    from sparsespec.training.run import train

    return train(compose_cfg("train", overrides(env, out, "trainer.max_steps=6", "trainer.val_check_interval=2",
                                                "export=false", *extra)), callbacks=list(callbacks))


def test_resume_reproduces_the_uninterrupted_run(env, tmp_path):
    # 4 training windows, batch 1: an epoch is 4 steps, so the run is killed mid-epoch (after the
    # step-2 checkpoint) and the resumed part crosses into the second epoch
    straight = Record()
    res_a = _train(env, tmp_path / "a", callbacks=[straight])
    assert sorted(straight.steps) == [1, 2, 3, 4, 5, 6]

    again = Record()
    _train(env, tmp_path / "a2", callbacks=[again])
    assert again.steps == straight.steps  # determinism: two runs, identical batches, budgets, losses

    killed = Record(crash_after=3)
    with pytest.raises(RuntimeError, match="simulated kill"):
        _train(env, tmp_path / "b", callbacks=[killed])
    last = tmp_path / "b" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 2
    assert {s: killed.steps[s] for s in (1, 2)} == {s: straight.steps[s] for s in (1, 2)}

    resumed = Record()
    res_c = _train(env, tmp_path / "c", f"ckpt_path={last}", callbacks=[resumed])
    assert sorted(resumed.steps) == [3, 4, 5, 6] and res_c["module"].train_steps_run == 4
    for s in (3, 4, 5, 6):
        ids, budgets, loss = resumed.steps[s]
        assert ids == straight.steps[s][0], f"step {s}: a different batch after resume"
        assert budgets == straight.steps[s][1], f"step {s}: a different sampled budget after resume"
        assert loss == straight.steps[s][2], f"step {s}: loss {loss} != {straight.steps[s][2]}"
    wa, wc = res_a["module"].drafter.state_dict(), res_c["module"].drafter.state_dict()
    assert all(torch.equal(wa[k], wc[k]) for k in wa)
    # the whole epoch is a permutation of the training windows (nothing repeated or skipped)
    first_epoch = [tuple(straight.steps[s][0][0]) for s in (1, 2, 3, 4)]
    assert len(set(first_epoch)) == 4


def test_resumable_loader_state_round_trip():
    ds = [{"x": torch.tensor([i])} for i in range(10)]
    a = ResumableLoader(ds, batch_size=2, seed=3)
    full = [b["x"].flatten().tolist() for _ in range(2) for b in a]  # two epochs
    assert len(full) == 10 and sorted(sum(full[:5], [])) == list(range(10)) and full[:5] != full[5:]
    b = ResumableLoader(ds, batch_size=2, seed=3)
    it = iter(b)
    got = [next(it)["x"].flatten().tolist() for _ in range(3)]
    state = b.state_dict()
    c = ResumableLoader(ds, batch_size=2, seed=3)
    c.load_state_dict(state)
    got += [x["x"].flatten().tolist() for x in c] + [x["x"].flatten().tolist() for x in c]
    assert got == full
    # two ranks split each epoch's permutation without overlap
    r0, r1 = (ResumableLoader(ds, 1, seed=3, rank=r, world_size=2) for r in (0, 1))
    s0 = {int(x["x"]) for x in r0}
    s1 = {int(x["x"]) for x in r1}
    assert not s0 & s1 and len(s0 | s1) == 10


# ---------------------------------------------------------------------------------------------
# 2. the teacher cache is never read damaged
# ---------------------------------------------------------------------------------------------


def test_damaged_teacher_shards_are_detected_and_rebuilt(env, tmp_path):
    made = []

    def factory():
        made.append(Teacher(tiny_target(len(env["tok"])), dtype="float32", topk=4))
        return made[-1]

    kw = dict(tokenizer=env["tok"], fingerprint=model_fingerprint(env["target"]), path=str(env["corpus"]),
              seq_len=64, n_train=6, n_val=1, teacher_dtype="float32", topk=4, cache_dir=str(tmp_path / "t"),
              shard_size=2)

    def fresh():
        dm = DraftDataModule(teacher=factory, **kw)
        dm.prepare_data()
        return dm

    dm = fresh()
    dm.setup()
    good = {k: v.clone() for k, v in dm.datasets["train"].targets.items()}
    cache = dm.caches["train"]
    assert cache.complete() and cache.n_shards == 3 and dm.computed_shards == 4  # 3 train + 1 val

    # truncated (a full disk, a partial copy)
    p0 = cache.shard_path(0)
    p0.write_bytes(p0.read_bytes()[: p0.stat().st_size // 2])
    # same size, damaged bytes
    p2 = cache.shard_path(2)
    raw = bytearray(p2.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 64] = bytes(64)
    p2.write_bytes(bytes(raw))
    # renamed into place but killed before its checksum was written
    cache.checksum_path(1).unlink()
    assert not cache.complete()
    with pytest.raises(TeacherCacheError, match="shard_00000"):
        cache.load()

    dm2 = fresh()
    assert dm2.computed_shards == 3  # exactly the three bad shards, no others
    dm2.setup()
    for k, v in good.items():
        assert torch.equal(dm2.datasets["train"].targets[k], v)

    # damaged after prepare_data, before setup: setup recomputes instead of reading it
    dm3 = fresh()
    assert dm3.computed_shards == 0
    p = dm3.caches["train"].shard_path(1)
    p.write_bytes(p.read_bytes()[:100])
    dm3.setup()
    assert dm3.computed_shards == 1
    assert torch.equal(dm3.datasets["train"].targets["targets"], good["targets"])


# ---------------------------------------------------------------------------------------------
# 3. determinism of decoding: same config and seed -> same output_ids, every method
# ---------------------------------------------------------------------------------------------


METHODS = ["ar", "sd", "sd_sparse", "magicdec", "snapkv_self", "sparsespec_l"]
SMALL = {"sd_sparse": ["method.drafter.policy.budget=48"], "sparsespec_l": ["method.controller.candidates=[2,4,6]"]}  # tiny sizes


def _methods():
    from sparsespec.config import check_method

    return {name: check_method(compose_cfg("evaluate", [f"method={name}", *SMALL.get(name, [])]).method)
            for name in METHODS}


def test_generation_is_deterministic_for_every_method():
    target = CausalLM(tiny_hf("llama", seed=0))
    drafter = CausalLM(tiny_hf("llama", seed=1, layers=1))
    prompt = random_prompt(128, seed=4)
    methods = _methods()
    assert isinstance(methods["sd"].build(target, drafter).drafter, ModelDrafter)
    assert isinstance(methods["magicdec"].policy(), StreamingKV)
    for name, m in methods.items():
        def gen(sampling, seed, m=m):
            # a fresh engine each time, as the harness builds one per (sample, method, repeat)
            return m.build(target, drafter, prefill_chunk=64).generate(prompt, 20, sampling, seed=seed)

        for sampling in (Sampling(), Sampling(0.9, 0.95)):
            a, b = gen(sampling, 7), gen(sampling, 7)
            assert a.output_ids == b.output_ids, (name, sampling)
            assert a.rounds == b.rounds, (name, sampling)
        # not vacuous: with sampling the seed matters
        assert gen(Sampling(0.9, 0.95), 8).output_ids != a.output_ids, name


_CHILD = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from conftest import random_prompt, tiny_hf
from sparsespec.decoding.sampling import Sampling
from sparsespec.eval.methods import Method
from sparsespec.models.runner import CausalLM
torch.set_num_threads(1)
m = Method(name="sparsespec_l",
           drafter={"_target_": "sparsespec.decoding.drafters.SelfDrafter",
                    "policy": {"_target_": "sparsespec.kv.recall.RecallIndex", "ratio": 0.1, "k_recent": 16}},
           controller={"_target_": "sparsespec.decoding.controllers.EntropyController", "candidates": [2, 4, 6]})
res = m.build(CausalLM(tiny_hf("llama", seed=0))).generate(random_prompt(200, seed=4), 32, Sampling(0.8, 0.9), seed=11)
print(json.dumps(res.output_ids))
"""


@pytest.mark.slow
def test_sampled_generation_is_identical_across_processes(tmp_path):
    outs = []
    for hashseed in ("1", "2"):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": hashseed}
        r = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT / "tests")], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert outs[0] == outs[1] and len(outs[0]) == 32


def test_train_refuses_a_gpu_this_machine_lacks_before_any_model_loads(env, tmp_path, no_model_load):
    from sparsespec.training.run import train

    cfg = compose_cfg("train", overrides(env, tmp_path / "out", "model.device=cuda:99"))
    with pytest.raises(ConfigError, match=r"model.device=cuda:99: (CUDA is not available|this machine has)"):
        train(cfg)
    assert not (tmp_path / "out").exists()

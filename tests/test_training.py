"""BudgetDraft training, offline and fast: a tiny random Llama target, a tiny BPE tokenizer trained
in the tests, a small generated corpus (tests/helpers.py). Covers losses (hand-computed), mask/view parity with the inference
runner, train.py through Hydra compose, resume, export -> speculative round trip, teacher cache."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F
from helpers import CONF, overrides, run_train, tiny_target
from helpers import text as _text
from hydra import compose, initialize_config_dir
from transformers import AutoModelForCausalLM

from sparsespec.checks import ConfigError
from sparsespec.config import register_configs
from sparsespec.decoding.controllers import FixedK
from sparsespec.decoding.drafters import ModelDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.kv.policies import StreamingKV
from sparsespec.models.runner import CausalLM
from sparsespec.training import losses
from sparsespec.training.budgets import BudgetSampler, sparse_rows, view_mask
from sparsespec.training.data import DraftDataModule
from sparsespec.training.drafters import DrafterSpec
from sparsespec.training.export import latest_drafter_path
from sparsespec.training.module import BudgetDraftModule, accepted_run
from sparsespec.training.teacher import Teacher, model_fingerprint

register_configs()  # the groups train.py registers (the drafter / budget / loss / corpus bases)
pytestmark = pytest.mark.usefixtures("isolated")  # LATEST pointer, teacher cache, Arrow cache in tmp_path


@pytest.fixture
def env(training_env):
    return training_env


# ---------------------------------------------------------------------------------------------
# losses: hand-computed values and gradients
# ---------------------------------------------------------------------------------------------


def test_ce_value_and_gradient():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 3.0]], requires_grad=True)
    tgt = torch.tensor([0, 1])
    loss = losses.ce(logits, tgt)
    z0 = torch.log(torch.exp(torch.tensor(2.0)) + 2)
    z1 = torch.log(1 + torch.exp(torch.tensor(1.0)) + torch.exp(torch.tensor(3.0)))
    assert torch.allclose(loss, ((z0 - 2) + (z1 - 1)) / 2)
    loss.backward()
    expect = (F.softmax(logits.detach(), -1) - F.one_hot(tgt, 3).float()) / 2
    assert torch.allclose(logits.grad, expect, atol=1e-6)


def test_acceptance_prob_min_overlap_and_greedy_fallback():
    q = torch.tensor([[0.5, 0.3, 0.2]])
    logp = q.log()
    idx = torch.tensor([[1, 0]])  # teacher top-2: token 1 (p=0.6), token 0 (p=0.3)
    tlogp = torch.tensor([[0.6, 0.3]]).log()
    alpha = losses.acceptance_prob(logp, torch.tensor([1]), idx, tlogp)
    assert torch.allclose(alpha, torch.tensor([min(0.3, 0.6) + min(0.5, 0.3)]))  # 0.6
    assert torch.allclose(losses.acceptance_prob(logp, torch.tensor([2])), torch.tensor([0.2]))


def test_survival_weights_by_hand():
    alpha = torch.tensor([0.5, 0.5, 1.0])
    # depth 2: w_t = (1 + alpha_{t-1}) / 2 -> [1, .75, .75], normalised to mean 1
    w = losses.survival_weights(alpha, 2)
    raw = torch.tensor([1.0, 0.75, 0.75])
    assert torch.allclose(w, raw / raw.mean())
    # depth 3 (alpha before the sequence start counts as 1): w_0 = 1, w_1 = (1 + a0 + a0) / 3,
    # w_2 = (1 + a1 + a1 a0) / 3
    w3 = losses.survival_weights(alpha, 3)
    raw3 = torch.tensor([1.0, (1 + 0.5 + 0.5) / 3, (1 + 0.5 + 0.25) / 3])
    assert torch.allclose(w3, raw3 / raw3.mean())


def test_acceptance_loss_value_and_weights_detached():
    logits = torch.tensor([[1.0, 0.0], [0.0, 2.0]], requires_grad=True)
    tgt = torch.tensor([0, 1])
    loss = losses.acceptance_loss(logits, tgt, depth=2)
    q = F.softmax(logits.detach(), -1)
    a = torch.stack([q[0, 0], q[1, 1]])
    w = torch.tensor([1.0, (1 + a[0].item()) / 2])
    w = w / w.mean()
    assert torch.allclose(loss, (w * -a.log()).mean())
    loss.backward()
    # with weights held constant, d/dlogits of w_t * -log q_t(y) is w_t * (softmax - onehot) / n
    expect = w[:, None] * (q - F.one_hot(tgt, 2).float()) / 2
    assert torch.allclose(logits.grad, expect, atol=1e-6)


def test_kl_zero_for_equal_views_and_gradient():
    full = torch.tensor([[0.5, -1.0, 2.0]])
    sp = full.clone().requires_grad_(True)
    assert losses.kl(full, sp).abs() < 1e-7
    sp2 = torch.tensor([[0.0, 0.0, 0.0]], requires_grad=True)
    val = losses.kl(full, sp2)
    p = F.softmax(full, -1)
    assert torch.allclose(val, (p * (p.log() - torch.log(torch.tensor(1 / 3)))).sum())
    val.backward()
    assert torch.allclose(sp2.grad, F.softmax(sp2.detach(), -1) - p, atol=1e-6)  # q - p


def test_accepted_run():
    agree = torch.tensor([True, True, False, True])
    # starts 0..2 with k=2: min(run, 2) = [2, 1, 0] -> mean 1
    assert accepted_run(agree, 2).item() == pytest.approx(1.0)


def test_budget_sampler_drops_full_budgets_and_respects_modes():
    s = BudgetSampler(mode="multi", values=[256, 512, 1024, 2048], k_sink=16)
    assert s.candidates(2048)[0] == [256, 512, 1024]
    rng = random.Random(0)
    seen = {s.sample(2048, rng)[0] for _ in range(200)}
    assert seen == {256, 512, 1024}
    assert BudgetSampler(mode="single", values=[512]).sample(2048, rng) == [512]
    assert BudgetSampler(mode="full").sample(2048, rng) == []
    r = BudgetSampler(mode="multi", ratios=[0.25, 0.5, 0.75], k_sink=16)
    assert r.candidates(1024)[0] == [256, 512, 768]
    with pytest.raises(ValueError):
        BudgetSampler(mode="sometimes")


# ---------------------------------------------------------------------------------------------
# training views == inference views
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [8, 16, 24])
def test_masked_training_forward_equals_inference_runner(budget):
    target = tiny_target(97, seed=1)
    drafter = DrafterSpec(kind="truncated", n_layers=2, freeze_embeddings=False).build(target).eval()
    module = BudgetDraftModule(drafter, BudgetSampler(mode="multi", values=[budget], k_sink=4), losses.BudgetDraftLoss(),
                               optim={})  # no optimizer step here
    n = 48
    ids = torch.randint(0, 97, (n,), generator=torch.Generator().manual_seed(budget))
    with torch.no_grad():
        train_logits = module.logits(ids[None], budget)[0]
        full_logits = module.logits(ids[None])[0]
    view = StreamingKV(budget=budget, k_sink=4)
    lm = CausalLM(drafter)
    # 1) one forward over the whole sequence under the view's mask
    ref = lm.forward(ids, lm.new_cache(n), mask=view.mask(0, n, n))
    assert torch.allclose(train_logits, ref, atol=1e-4)
    # 2) chunks of 7 under view.mask, then one token at a time
    cache = lm.new_cache(n)
    for start in range(0, 30, 7):
        end = min(start + 7, 30)
        lm.forward(ids[start:end], cache, mask=view.mask(start, end - start, end), logits="none")
    for p in range(30, n):
        step = lm.forward(ids[p : p + 1], cache, mask=view.mask(p, 1, p + 1))[-1]
        assert torch.allclose(train_logits[p], step, atol=1e-4)
    # the view matters exactly from sparse_rows on (so the test cannot pass with a causal mask)
    s = sparse_rows(budget, n)
    assert torch.allclose(train_logits[:s], full_logits[:s], atol=1e-5)
    assert (train_logits[s:] - full_logits[s:]).abs().max() > 1e-3
    assert view_mask(budget, 4, n).shape == (1, 1, n, n)


# ---------------------------------------------------------------------------------------------
# teacher targets: cached, sharded, resumable
# ---------------------------------------------------------------------------------------------


def test_teacher_cache_reuse_and_resume(env, tmp_path):
    made = []

    def factory():
        t = Teacher(tiny_target(len(env["tok"])), dtype="float32", topk=4)
        made.append(t)
        return t

    kw = dict(tokenizer=env["tok"], fingerprint=model_fingerprint(env["target"]), path=str(env["corpus"]),
              seq_len=64, n_train=6, n_val=1, teacher_dtype="float32", topk=4, cache_dir=str(tmp_path / "t"),
              shard_size=2)
    dm = DraftDataModule(teacher=factory, **kw)
    dm.prepare_data()
    dm.setup()
    assert len(made) == 1 and made[0].calls == 7  # 6 train + 1 val sequences, batch 1
    first = dm.datasets["train"].targets
    # greedy targets are the target's argmax at every position
    with torch.no_grad():
        expect = made[0].model(dm.splits["train"][:1].long()).logits.argmax(-1)
    assert torch.equal(first["targets"][:1].long(), expect)

    dm2 = DraftDataModule(teacher=factory, **kw)
    dm2.prepare_data()
    dm2.setup()
    assert len(made) == 1 and dm2.computed_shards == 0  # the target is never built nor called again
    assert torch.equal(dm2.datasets["train"].targets["targets"], first["targets"])

    dm2.caches["train"].shard_path(1).unlink()  # a run killed mid-way: only the missing shard reruns
    dm3 = DraftDataModule(teacher=factory, **kw)
    dm3.prepare_data()
    assert dm3.computed_shards == 1 and made[-1].calls == 2
    # a different setting is a different cache key
    dm4 = DraftDataModule(teacher=factory, **{**kw, "topk": 2})
    dm4.prepare_data()
    assert dm4.computed_shards > 0


def test_on_policy_windows_are_the_targets_own_greedy_continuation(env, tmp_path):
    target = tiny_target(len(env["tok"]))
    n_new, seq_len = 16, 64
    made = []

    def factory():
        made.append(Teacher(target, dtype="float32", topk=4, batch_size=3, on_policy_tokens=n_new))
        return made[-1]

    kw = dict(tokenizer=env["tok"], fingerprint=model_fingerprint(target), path=str(env["corpus"]), seq_len=seq_len,
              n_train=5, n_val=1, teacher_dtype="float32", topk=4, cache_dir=str(tmp_path / "t"), shard_size=4)
    dm = DraftDataModule(teacher=factory, on_policy_tokens=n_new, **kw)
    dm.prepare_data()
    dm.setup()
    ids, tg = dm.datasets["train"].ids, dm.datasets["train"].targets
    prompts = dm.splits["train"]
    assert ids.shape == (5, seq_len) and prompts.shape == (5, seq_len - n_new)
    assert torch.equal(ids[:, : seq_len - n_new], prompts)  # the window starts with the book text
    with torch.no_grad():
        logits = target(ids.long()).logits
        reference = greedy_continuation(target, prompts[:1].long(), n_new)
    # the continuation is plain greedy decoding of the prompt (batched, one row = unbatched)...
    assert torch.equal(ids[:1].long(), reference)
    # ...and the cached targets are the target's teacher-forced argmax / top-k over the whole sequence
    assert torch.equal(tg["targets"].long(), logits.argmax(-1))
    assert torch.equal(ids[:, seq_len - n_new :], tg["targets"][:, seq_len - n_new - 1 : -1])
    top = torch.log_softmax(logits.float(), -1).topk(4, dim=-1)
    assert torch.equal(tg["topk_idx"].long(), top.indices)
    assert torch.allclose(tg["topk_logp"], top.values, atol=1e-4)
    # batch 3 over shards of 4 rows (+ the val row): 2 + 1 + 1 calls; a second run reuses the cache
    assert made[0].calls == 4
    dm2 = DraftDataModule(teacher=factory, on_policy_tokens=n_new, **kw)
    dm2.prepare_data()
    dm2.setup()
    assert len(made) == 1 and torch.equal(dm2.datasets["train"].ids, ids)
    # book-text windows of the same data are another cache entry
    dm3 = DraftDataModule(teacher=lambda: Teacher(target, dtype="float32", topk=4), **kw)
    dm3.prepare_data()
    assert dm3.computed_shards > 0


def test_far_copy_windows_are_labelled_by_the_teacher_and_shared_across_seeds(env, tmp_path):
    from sparsespec.data.far_copy import far_copy

    target = tiny_target(len(env["tok"]))
    kw = dict(tokenizer=env["tok"], fingerprint=model_fingerprint(target), path=str(env["corpus"]), seq_len=64,
              n_train=10, n_val=1, teacher_dtype="float32", topk=4, cache_dir=str(tmp_path / "t"), shard_size=4,
              far_copy_distances=[10, 30], far_copy_span=16)
    factory = lambda: Teacher(target, dtype="float32", topk=4)  # noqa: E731
    plain = DraftDataModule(teacher=factory, **kw)._sequences()["train"]
    dm = DraftDataModule(teacher=factory, far_copy_share=1.0, **kw)
    dm.prepare_data()
    dm.setup()
    ids = dm.datasets["train"].ids
    # every window: its book text up to the span, then the span copied from 10 or 30 tokens back
    drawn = set()
    for row, book in zip(ids.tolist(), plain.tolist(), strict=True):
        assert row[:48] == book[:48] and row in (far_copy(book, 10, 16), far_copy(book, 30, 16))
        drawn.add(10 if row == far_copy(book, 10, 16) else 30)
    assert drawn == {10, 30}
    with torch.no_grad():  # the teacher labels the copied text, not the book's
        assert torch.equal(dm.datasets["train"].targets["targets"].long(), target(ids.long()).logits.argmax(-1))
    half = DraftDataModule(teacher=factory, far_copy_share=0.5, seed=3, **kw)._sequences()["train"]
    again = DraftDataModule(teacher=factory, far_copy_share=0.5, seed=4, **kw)._sequences()["train"]
    assert torch.equal(half, again)  # the draw does not follow the training seed: one teacher cache for all
    assert 0 < sum(not torch.equal(a, b) for a, b in zip(half, plain, strict=True)) < 10
    with pytest.raises(ConfigError, match="corpus.far_copy_distances"):
        DraftDataModule(teacher=factory, **{**kw, "far_copy_distances": [60]}, far_copy_share=0.5)


def test_loss_positions_train_only_the_last_positions(env):
    torch.manual_seed(0)
    drafter = DrafterSpec(n_layers=1).build(tiny_target(len(env["tok"])))
    sampler = BudgetSampler(mode="multi", values=[8], k_sink=2)
    module = BudgetDraftModule(drafter, sampler, losses.BudgetDraftLoss(), optim={}, loss_positions=12)
    ids = torch.randint(0, len(env["tok"]), (1, 40))
    batch = {"input_ids": ids, "targets": torch.randint(0, len(env["tok"]), (1, 40))}
    module.log = lambda *a, **k: None
    loss = module.training_step(batch, 0)
    early = {**batch, "targets": batch["targets"].clone()}
    early["targets"][0, :28] = (early["targets"][0, :28] + 1) % len(env["tok"])
    assert torch.equal(module.training_step(early, 0), loss)  # targets before the last 12 do not count
    late = {**batch, "targets": batch["targets"].clone()}
    late["targets"][0, 35] = (late["targets"][0, 35] + 1) % len(env["tok"])
    assert not torch.equal(module.training_step(late, 0), loss)


def test_windows_past_the_trained_positions_train_with_yarn(env, tmp_path):
    short = tmp_path / "short"
    model = tiny_target(len(env["tok"]))
    model.config.max_position_embeddings = 32
    model.save_pretrained(short)
    env["tok"].save_pretrained(short)
    out = tmp_path / "yarn"
    run_train(overrides(env, out, "trainer.fast_dev_run=true", f"model.path={short}"))
    rope = AutoModelForCausalLM.from_pretrained(out / "drafter").config.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == 2  # the 64-token windows, as evaluation scales them


def greedy_continuation(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """n greedy tokens by full recomputation (no cache): the independent reference."""
    ids = prompt
    for _ in range(n):
        ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


# ---------------------------------------------------------------------------------------------
# train.py through Hydra compose, resume, export -> engine
# ---------------------------------------------------------------------------------------------


def test_compose_fast_dev_run_and_configs(env, tmp_path):
    out = tmp_path / "fdr"
    res = run_train(overrides(env, out, "trainer.fast_dev_run=true", "budget=multi", "budget.values=[16,32]"),
                    command="python train.py budget=multi")
    assert res["trainer"].global_step == 1
    assert (out / "drafter" / "config.json").is_file()
    # the command that made the run is kept with its metrics (docs tables built from them cite it)
    assert json.loads((out / "metrics.json").read_text())["command"] == "python train.py budget=multi"
    for group in ("budget=single", "budget=full", "drafter=small", "trainer=ddp", "trainer=fsdp", "logger=wandb",
                  "loss=ce", "budget.ratios=[0.25,0.5]"):
        with initialize_config_dir(str(CONF), version_base="1.3"):
            cfg = compose("train", overrides=[group])
        assert cfg.trainer._target_.endswith("Trainer")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_scale_out_configs_run_as_one_cpu_process(env, tmp_path, strategy):
    res = run_train(overrides(env, tmp_path / strategy, f"trainer={strategy}", "trainer.fast_dev_run=true",
                              "trainer.precision=32-true", "export=false"))
    assert res["trainer"].global_step == 1
    # Lightning's FSDP needs CUDA; on a CPU-only machine trainer=fsdp runs single-device (logged)
    expect = {"ddp": "DDPStrategy", "fsdp": "FSDPStrategy" if torch.cuda.is_available() else "SingleDeviceStrategy"}
    assert type(res["trainer"].strategy).__name__ == expect[strategy]


def test_train_resume_export_and_speculative_round_trip(env, tmp_path):
    out = tmp_path / "run"
    res = run_train(overrides(env, out, "trainer.max_steps=2", "trainer.val_check_interval=2"))
    assert res["trainer"].global_step == 2
    assert res["summary"]["teacher_shards_computed"] > 0
    assert "val/acc_B16" in res["metrics"] and "val/acc_full" in res["metrics"]
    last = out / "checkpoints" / "last.ckpt"
    assert last.is_file() and list((out / "checkpoints").glob("best-*.ckpt"))
    assert (out / "csv" / "metrics.csv").is_file()
    export = out / "drafter"
    assert latest_drafter_path() == export.resolve()

    # resume: continues at step 2, runs exactly 2 more; teacher targets come from the cache
    res2 = run_train(overrides(env, tmp_path / "run2", f"ckpt_path={last}", "trainer.max_steps=4",
                               "trainer.val_check_interval=2"))
    assert res2["trainer"].global_step == 4 and res2["module"].train_steps_run == 2
    assert res2["summary"]["teacher_shards_computed"] == 0
    assert latest_drafter_path() == (tmp_path / "run2" / "drafter").resolve()

    # export -> speculative decoding with a sparse view: greedy output identical to AR
    drafter = AutoModelForCausalLM.from_pretrained(export).eval()
    assert drafter.config.num_hidden_layers == 2
    target = CausalLM(env["target"])
    prompt = env["tok"](_text(7, 80))["input_ids"][:70]
    ar = SpeculativeEngine(target).generate(prompt, 24)
    spec = SpeculativeEngine(target, ModelDrafter(CausalLM(drafter), StreamingKV(budget=16, k_sink=4)),
                             FixedK(3)).generate(prompt, 24)
    assert spec.output_ids == ar.output_ids
    assert spec.drafted > 0


def test_loss_group_matches_the_parts():
    torch.manual_seed(0)
    full, sp = torch.randn(5, 7), torch.randn(5, 7, requires_grad=True)
    tgt = torch.randint(0, 7, (5,))
    lf = losses.BudgetDraftLoss(ce=1.0, acc=0.5, sparse_ce=2.0, kl=0.25, sparse_acc=1.0, depth=3)
    f = lf.full(full, tgt)
    assert torch.allclose(f["ce"], losses.ce(full, tgt))
    assert torch.allclose(f["acc"], 0.5 * losses.acceptance_loss(full, tgt, depth=3))
    s = lf.sparse(sp, full, tgt)
    assert torch.allclose(s["sparse_ce"], 2.0 * losses.ce(sp, tgt))
    assert torch.allclose(s["kl"], 0.25 * losses.kl(full, sp))
    assert torch.allclose(s["sparse_acc"], losses.acceptance_loss(sp, tgt, depth=3))


# ---------------------------------------------------------------------------------------------
# training length: trainer.max_steps=-1 (epochs) sizes the LR schedule; no length is refused
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra,keys", [
    (["trainer.max_steps=-1"], ["trainer.max_steps=-1", "trainer.max_epochs=-1", "trainer.max_epochs=N"]),
    (["trainer.max_steps=-1", "trainer.max_epochs=0"], ["trainer.max_epochs=0", "positive"]),
    (["trainer.max_epochs=-2"], ["trainer.max_epochs=-2", "positive"]),
    (["trainer.max_steps=0"], ["trainer.max_steps=0", "-1 (use max_epochs)"]),
    (["trainer.max_steps=-5", "trainer.max_epochs=2"], ["trainer.max_steps=-5", "positive"]),
], ids=["no-length", "zero-epochs", "epochs-below-minus-one", "zero-steps", "steps-below-minus-one"])
def test_training_length_without_an_end_is_refused_before_any_model_loads(env, tmp_path, monkeypatch, extra, keys):
    from sparsespec.config import ConfigError
    from sparsespec.models import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as e:  # was an OverflowError from the LR schedule (int(inf))
        run_train(overrides(env, out, *extra))
    msg = str(e.value)
    assert "\n" not in msg and all(k in msg for k in keys), msg
    assert not out.exists()


def test_max_steps_minus_one_schedules_max_epochs_and_resumes_exactly(env, tmp_path):
    from lightning.pytorch.callbacks import Callback
    from omegaconf import OmegaConf

    from sparsespec.training.run import check_training_length, train

    # max_epochs unset: Lightning's 1000 epochs end training; fast_dev_run sets its own length
    check_training_length(OmegaConf.create({"max_steps": -1, "max_epochs": None}))
    check_training_length(OmegaConf.create({"max_steps": -1, "max_epochs": -1, "fast_dev_run": True}))

    class Record(Callback):
        def __init__(self):
            self.steps: dict[int, tuple] = {}

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            self.steps[trainer.global_step] = (batch["input_ids"].tolist(), float(loss.detach()),
                                               trainer.optimizers[0].param_groups[0]["lr"])

    def fit(out, *extra):
        rec = Record()
        with initialize_config_dir(str(CONF), version_base="1.3"):
            cfg = compose("train", overrides=overrides(env, out, "corpus.n_train=2", "trainer.max_steps=-1",
                                                       "trainer.max_epochs=2", "trainer.val_check_interval=1",
                                                       "callbacks.checkpoint.save_top_k=-1", "export=false", *extra))
        return train(cfg, callbacks=[rec]), rec

    # 2 windows, batch 1: 2 steps an epoch, so the schedule spans 2 x 2 = 4 steps and ends at the floor
    res, straight = fit(tmp_path / "a")
    assert res["trainer"].global_step == 4 and sorted(straight.steps) == [1, 2, 3, 4]
    assert res["trainer"].optimizers[0].param_groups[0]["lr"] == pytest.approx(5e-4 * 0.1)
    # resumed from step 1 (mid-epoch): the same batches, losses and learning rates as the straight run
    # (Lightning's estimated_stepping_batches sets the train loader up before the restore, which then
    # leaves the loader's position behind: Lightning-AI/pytorch-lightning#20550)
    ckpt = tmp_path / "a" / "checkpoints" / "best-step=1.ckpt"
    res2, resumed = fit(tmp_path / "b", f"ckpt_path='{ckpt}'")  # quoted: the name holds an =
    assert sorted(resumed.steps) == [2, 3, 4] and res2["module"].train_steps_run == 3
    for s in (2, 3, 4):
        assert resumed.steps[s] == straight.steps[s], f"step {s} differs after resume"

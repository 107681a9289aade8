"""Training with several processes, on the CPU: two processes over gloo stand in for two GPUs.

* the sharded teacher pass (DraftDataModule.setup under a 2-process gloo group): each rank computes
  its own shards, the cache is byte-identical to a one-process cache, meta.json is written once;
  two separate jobs filling one cache_dir at the same time leave a complete, verified cache;
* the export gather (export.full_state_dict) under torch's FSDP2 (`fully_shard`, which runs on the
  CPU; Lightning's FSDPStrategy is FSDP1 and refuses the CPU) round-trips: same logits after load;
* train.py end to end under Lightning DDP with 2 CPU processes (this file re-run as a script by
  Lightning's launcher): sharded teacher pass in setup(), training, gathered export, round trip;
* the per-rank GPU choice, the FSDP auto-wrap policy and the bf16 fallback, with CUDA faked.

Not covered here (no GPU on this machine): NCCL, Lightning's FSDPStrategy itself, bf16 on a GPU.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import CONF, isolated_cache, overrides, run_train, tiny_target

from sparsespec.training import teacher as teacher_mod
from sparsespec.training.data import DraftDataModule
from sparsespec.training.drafters import DrafterSpec
from sparsespec.training.teacher import TargetTeacher, TeacherCache, model_fingerprint

pytestmark = pytest.mark.usefixtures("isolated")  # teacher cache and LATEST pointer inside each test's tmp dir


@pytest.fixture
def env(training_env):
    return training_env


HERE = Path(__file__).resolve()
IDS = torch.arange(40).remainder(50)[None]  # fixed input for logit comparisons (vocabulary > 50)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)  # two processes share this machine's cores
    os.environ["LOCAL_RANK"] = str(rank)  # as torchrun sets it (one inherited from an earlier Lightning run is stale)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


# ---------------------------------------------------------------------------------------------
# the sharded teacher pass
# ---------------------------------------------------------------------------------------------

DM = dict(seq_len=64, n_train=6, n_val=2, teacher_dtype="float32", topk=4, shard_size=2)  # 3 train + 1 val shards


def _teacher_worker(rank: int, world: int, port: int, model_dir: str, corpus: str, cache_dir: str, out: str,
                    group: bool) -> None:
    """One process of the teacher pass: `group` makes it a rank of a gloo group (one job); without
    it the processes are separate jobs sharing cache_dir."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if group:
        _init(rank, world, port)
    else:
        torch.set_num_threads(1)
    writes: list[str] = []
    write = teacher_mod._atomic_write_bytes

    def recording(path: Path, data: bytes) -> None:  # every file this process put into the cache
        writes.append(f"{path.parent.name}/{path.name}")
        write(path, data)

    teacher_mod._atomic_write_bytes = recording
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    factory = TargetTeacher(target, "float32", topk=4)
    del target
    dm = DraftDataModule(tokenizer=AutoTokenizer.from_pretrained(model_dir), teacher=factory,
                         fingerprint=model_fingerprint(factory.target), path=corpus, cache_dir=cache_dir, **DM)
    dm.prepare_data()  # one process: the teacher pass; in a group: nothing (setup shards it)
    dm.setup()
    keys = {name: cache.dir.name for name, cache in dm.caches.items()}
    shards = {name: sorted(int(w.split("shard_")[1][:5]) for w in writes if w.startswith(f"{key}/") and
                           w.endswith(".pt")) for name, key in keys.items()}
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "computed": dm.computed_shards, "shards": shards, "made": factory.made,
        "meta_writes": sum(w.endswith("meta.json") for w in writes), "released": factory.target is None}))
    torch.save({name: ds.targets for name, ds in dm.datasets.items()}, Path(out, f"rank{rank}.pt"))
    if group:
        dist.destroy_process_group()


def _teacher_run(env, tmp: Path, name: str, world: int, cache: Path, group: bool = True) -> list[dict]:
    out = tmp / name
    out.mkdir()
    mp.spawn(_teacher_worker, nprocs=world, args=(world, _free_port(), str(env["model_dir"]), str(env["corpus"]),
                                                  str(cache), str(out), group))
    return [json.loads((out / f"rank{r}.json").read_text()) | {"targets": torch.load(out / f"rank{r}.pt")}
            for r in range(world)]


@pytest.mark.slow
def test_sharded_teacher_pass_two_gloo_ranks_equals_one_process(env, tmp_path):
    one = _teacher_run(env, tmp_path, "one", 1, tmp_path / "cache1")[0]
    assert one["computed"] == 4 and one["meta_writes"] == 2 and one["made"] == 1 and one["released"]

    two = _teacher_run(env, tmp_path, "two", 2, tmp_path / "cache2")
    # the 4 missing shards (train 0-2, val 0) in turn: rank 0 takes the 1st and 3rd, rank 1 the 2nd and 4th
    assert two[0]["shards"] == {"train": [0, 2], "val": []}
    assert two[1]["shards"] == {"train": [1], "val": [0]}
    assert [r["computed"] for r in two] == [2, 2] and all(r["made"] == 1 for r in two)
    assert [r["meta_writes"] for r in two] == [2, 0]  # once per split, by rank 0, after the barrier
    for r in two:  # every rank reads the whole cache: the one-process targets, tensor for tensor
        assert r["released"]
        for split, targets in one["targets"].items():
            assert targets.keys() == r["targets"][split].keys()
            for k, v in targets.items():
                assert torch.equal(r["targets"][split][k], v), (split, k)
    # the shard files themselves are byte-identical (their bytes depend on the tensors alone)
    sums = lambda root: {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*.sha256")}  # noqa: E731
    assert sums(tmp_path / "cache1") == sums(tmp_path / "cache2") and len(sums(tmp_path / "cache1")) == 4
    assert not list((tmp_path / "cache2").rglob("*.tmp"))

    # a second job on the complete cache computes nothing and never builds a teacher
    again = _teacher_run(env, tmp_path, "again", 2, tmp_path / "cache2")
    assert [(r["computed"], r["made"], r["meta_writes"]) for r in again] == [(0, 0, 0), (0, 0, 0)]


@pytest.mark.slow
def test_two_jobs_filling_one_cache_dir_at_once_leave_it_whole(env, tmp_path):
    # two independent processes (no process group) both compute every shard into the same directory
    jobs = _teacher_run(env, tmp_path, "jobs", 2, tmp_path / "cache", group=False)
    ref = jobs[0]["targets"]
    for r in jobs:
        for split, targets in ref.items():
            for k, v in targets.items():
                assert torch.equal(r["targets"][split][k], v)
    for key in {p.parent for p in (tmp_path / "cache").rglob("meta.json")}:
        n = json.loads((key / "meta.json").read_text())["n"]
        cache = TeacherCache(key.parent, key.name, n, DM["shard_size"])
        assert cache.complete() and not cache.missing()
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_a_shard_written_twice_is_identical_and_a_finished_shard_is_skipped(tmp_path):
    shard = {"targets": torch.arange(12, dtype=torch.int32).view(3, 4), "topk_logp": torch.randn(3, 4, 2)}
    path = tmp_path / "shard_00000.pt"
    d1 = teacher_mod._atomic_save(shard, path)
    first = path.read_bytes()
    d2 = teacher_mod._atomic_save(shard, path)  # a second writer of the same tensors (another rank or job)
    assert d1 == d2 and path.read_bytes() == first and not list(tmp_path.glob("*.tmp"))

    calls = []
    cache = TeacherCache(tmp_path, "k", n=4, shard_size=2)

    def factory():
        calls.append(1)
        return teacher_mod.Teacher(torch.nn.Identity(), "float32")  # never called: nothing left to compute

    ids = torch.zeros(4, 3, dtype=torch.int32)
    cache.dir.mkdir()
    for i in range(2):  # another process finished both shards after this one listed them as missing
        digest = teacher_mod._atomic_save({"targets": torch.zeros(2, 3, dtype=torch.int32)}, cache.shard_path(i))
        cache.checksum_path(i).write_text(digest + "\n")
    assert cache.compute(ids, factory, [0, 1]) == 0 and not calls


# ---------------------------------------------------------------------------------------------
# the export: a full state dict gathered from FSDP shards round-trips
# ---------------------------------------------------------------------------------------------


def _export_worker(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sparsespec.training.drafters import decoder_layer_classes
    from sparsespec.training.export import export_drafter, full_state_dict

    _init(rank, world, port)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    drafter = DrafterSpec(kind="truncated", n_layers=2).build(target)
    untrained = drafter.model.layers[0].self_attn.q_proj.weight.detach().clone()
    layer_types = decoder_layer_classes(drafter)
    for m in list(drafter.modules()):  # the policy train.py gives Lightning's FSDP: one unit per decoder layer
        if type(m) in layer_types:
            fully_shard(m)
    fully_shard(drafter)
    local = drafter.model.layers[0].self_attn.q_proj.weight.to_local()
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-2)
    g = torch.Generator().manual_seed(rank)
    for _ in range(2):  # a couple of steps, so the export must hold trained (not initial) weights
        ids = torch.randint(0, 50, (1, 32), generator=g)
        drafter(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        logits = drafter.eval()(input_ids=IDS).logits
    state = full_state_dict(drafter)  # every rank: it is a collective
    if rank == 0:
        export_drafter(drafter, AutoTokenizer.from_pretrained(model_dir), out, state_dict=state, update_latest=False)
        torch.save({"logits": logits, "untrained": untrained, "gathered": state["model.layers.0.self_attn.q_proj.weight"]},
                   Path(out, "ref.pt"))
    Path(out, f"rank{rank}.json").write_text(json.dumps({"keys": len(state), "local_rows": local.shape[0],
                                                         "full_rows": untrained.shape[0]}))
    dist.destroy_process_group()


@pytest.mark.slow
def test_export_gathers_fsdp2_shards_on_two_gloo_ranks_and_round_trips(env, tmp_path):
    from sparsespec.models.loading import load_model

    mp.spawn(_export_worker, nprocs=2, args=(2, _free_port(), str(env["model_dir"]), str(tmp_path)))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["local_rows"] < r0["full_rows"]  # each rank really held only a shard of the weights
    assert r0["keys"] > 0 and r1["keys"] == 0  # the full state dict lands on rank 0 only
    ref = torch.load(tmp_path / "ref.pt")
    assert ref["gathered"].shape == ref["untrained"].shape and not torch.equal(ref["gathered"], ref["untrained"])
    loaded = load_model(str(tmp_path / "drafter"), dtype="float32", device="cpu").model
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=IDS).logits, ref["logits"], atol=1e-5)


# ---------------------------------------------------------------------------------------------
# train.py under Lightning DDP, 2 CPU processes
# ---------------------------------------------------------------------------------------------


def _ddp_main(model_dir: str, corpus: str, out: str) -> None:
    """Run as a script (below): Lightning's DDP launcher starts rank 1 by rerunning this command."""
    out_dir = Path(out)
    ovr = overrides({"model_dir": model_dir, "corpus": corpus}, out_dir / "run", "trainer=ddp", "trainer.devices=2",
                    "trainer.accelerator=cpu", "trainer.max_steps=2", "trainer.val_check_interval=2",
                    "+trainer.limit_val_batches=1", "trainer.num_sanity_val_steps=0", "trainer.log_every_n_steps=1",
                    "trainer.enable_progress_bar=false", "corpus.shard_size=2", "threads=1")
    res = run_train(ovr)
    trainer, module, dm = res["trainer"], res["module"], res["datamodule"]
    rank = trainer.global_rank
    with torch.no_grad():
        logits = module.drafter.eval()(input_ids=IDS).logits
    torch.save(logits, out_dir / f"logits{rank}.pt")
    (out_dir / f"rank{rank}.json").write_text(json.dumps({
        "strategy": type(trainer.strategy).__name__, "world_size": trainer.world_size, "step": trainer.global_step,
        "computed": dm.computed_shards, "total": res["summary"]["teacher_shards_computed"],
        "export_dir": str(res["export_dir"]) if res["export_dir"] else None, "released": dm.teacher.target is None}))


@pytest.mark.slow
def test_train_py_under_lightning_ddp_two_cpu_processes(env, tmp_path):
    from sparsespec.models.loading import load_model

    run_env = {**os.environ, "SPARSESPEC_CACHE": str(isolated_cache(tmp_path / "cache")), "HF_DATASETS_CACHE": str(tmp_path / "hf"),
               "WANDB_MODE": "offline", "PYTHONPATH": str(HERE.parent)}
    for k in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
        run_env.pop(k, None)
    proc = subprocess.run([sys.executable, str(HERE), str(env["model_dir"]), str(env["corpus"]), str(tmp_path)],
                          env=run_env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["strategy"] == r1["strategy"] == "DDPStrategy" and r0["world_size"] == 2
    assert r0["step"] == r1["step"] == 2
    # 2 train shards + 1 val shard: rank 0 took train 0 and val 0, rank 1 train 1; the summary sums them
    assert (r0["computed"], r1["computed"], r0["total"]) == (2, 1, 3)
    assert r0["released"] and r1["released"]  # the target is dropped once the targets are loaded
    assert r0["export_dir"] == str((tmp_path / "run" / "drafter").resolve()) and r1["export_dir"] is None
    # DDP kept the replicas equal, and the export holds them: same logits after load
    trained = torch.load(tmp_path / "logits0.pt")
    assert torch.allclose(torch.load(tmp_path / "logits1.pt"), trained, atol=1e-6)
    loaded = load_model(r0["export_dir"], dtype="float32", device="cpu").model
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=IDS).logits, trained, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# GPU choices, with CUDA faked (no GPU here)
# ---------------------------------------------------------------------------------------------


def _fake_cuda(monkeypatch, count: int = 4, bf16: bool = True) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100")


def test_each_rank_loads_the_target_onto_its_own_gpu(monkeypatch):
    from sparsespec.training.run import rank_device

    _fake_cuda(monkeypatch)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert rank_device("auto") == torch.device("cuda", 3) == rank_device("cuda")
    assert rank_device("cuda:1") == torch.device("cuda", 1)  # an explicit GPU is kept
    assert rank_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("LOCAL_RANK", "5")  # one visible GPU per process (e.g. srun --gpus-per-task=1)
    assert rank_device("auto") == torch.device("cuda", 1)
    monkeypatch.delenv("LOCAL_RANK")
    assert rank_device("auto") == torch.device("cuda", 0)


def test_fsdp_wraps_the_drafters_decoder_layers_and_bf16_falls_back_where_unsupported(monkeypatch, tmp_path):
    from hydra import compose, initialize_config_dir
    from lightning.pytorch.strategies import FSDPStrategy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from sparsespec.training.run import _strategy, _trainer_cfg

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["trainer=fsdp"])
    assert cfg.trainer.precision == "bf16-mixed"
    drafter = DrafterSpec(kind="truncated", n_layers=2).build(tiny_target(97))
    _fake_cuda(monkeypatch, bf16=True)
    tcfg = _trainer_cfg(cfg)
    assert tcfg.precision == "bf16-mixed" and "FSDPStrategy" in tcfg.strategy._target_
    strategy = _strategy(tcfg, drafter)
    assert isinstance(strategy, FSDPStrategy) and strategy.kwargs["use_orig_params"] is True
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {LlamaDecoderLayer}
    _fake_cuda(monkeypatch, bf16=False)  # a GPU without bf16: 32-true, logged
    assert _trainer_cfg(cfg).precision == "32-true"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU: one process, bf16 autocast stays
    cpu = _trainer_cfg(cfg)
    assert (cpu.strategy, cpu.accelerator, cpu.precision) == ("auto", "cpu", "bf16-mixed")
    assert _strategy(cpu, drafter) == "auto"


if __name__ == "__main__":  # the DDP test's job: python tests/test_training_dist.py MODEL_DIR CORPUS OUT
    _ddp_main(*sys.argv[1:4])

"""W&B sweeps, the Optuna search and offline W&B logging, without a W&B server.

Every conf/sweep/*.yaml is parsed and points are drawn from its space (sweep_points.py: the installed
wandb leaves that to its server); for two points per file the exact argv a `wandb agent` builds
(wandb's own create_sweep_command_args, `${args_no_hyphens}`) runs train.py or evaluate.py on a tiny
model, two agents at once, each with its own WANDB_RUN_ID. Each must exit 0, write into its own
out_dir named by the run id, open an offline W&B run, and hand the sweep's metric to W&B; what it
hands over is recorded by sweep_record.py around the public wandb.Run methods. The Optuna search
runs two trials.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sweep_points
import yaml
from helpers import isolated_cache, make_env
from omegaconf import OmegaConf

from sparsespec import sweeps, tracking

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
SWEEPS = sorted((CONF / "sweep").glob("*.yaml"))
RECORDER = Path(__file__).resolve().parent / "sweep_record.py"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 4-layer tiny Llama target (drafter.n_layers up to 4 is in the training sweep) and a corpus."""
    return make_env(tmp_path_factory.mktemp("sweeps"), layers=4, text_words=700)


def tiny_overrides(program: str, tiny: dict) -> dict:
    """What a tiny-model check adds to a sweep point (the sweep's own keys are left as sampled)."""
    if program == "train.py":
        return {"model.path": str(tiny["model_dir"]), "corpus.path": str(tiny["corpus"]), "trainer": "debug",
                "corpus.seq_len": 288, "corpus.n_train": 2, "corpus.n_val": 1, "budget.eval_values": [64, 256],
                "budget.k_sink": 4, "trainer.max_steps": 2, "threads": 1, "update_latest": False,
                "teacher.dtype": "float32"}
    return {"model.path": str(tiny["model_dir"]), "dataset": "text", "dataset.path": str(tiny["corpus"]),
            "ctx": 384, "limit": 1, "gen.max_new_tokens": 16, "runtime.threads": 1, "runtime.progress": False,
            "runtime.warmup": False}


def agent_env(tmp: Path, run_id: str, mode: str | None) -> dict:
    """The environment a `wandb agent` child gets: WANDB_RUN_ID set; W&B not configured here. Under
    sweep_record.py the run's W&B calls are recorded to tmp/wandb-<run id>.json."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_RUN_ID=run_id, SWEEP_RECORD=str(tmp / f"wandb-{run_id}.json"), WANDB_DIR=str(tmp / "wandb_dir"), WANDB_CONFIG_DIR=str(tmp / "wandb_cfg"),
               WANDB_CACHE_DIR=str(tmp / "wandb_cache"), NETRC=str(tmp / "no-netrc"),
               SPARSESPEC_CACHE=str(isolated_cache(tmp / "cache")), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    (tmp / "wandb_dir").mkdir(parents=True, exist_ok=True)
    if mode:
        env["WANDB_MODE"] = mode
    return env


def recorded(argv: list[str]) -> list[str]:
    """`python PROGRAM ARGS` as `python sweep_record.py PROGRAM ARGS`: the same run, its W&B calls recorded."""
    i = next(i for i, a in enumerate(argv) if a.endswith(".py"))
    return [*argv[:i], str(RECORDER), *argv[i:]]


def wandb_record(tmp: Path, run_id: str) -> dict:
    """What the run handed to W&B: id, project, config, summary, history (one dict per log call, media
    as {"_type": "Table"}), artifacts (name, type, files)."""
    return json.loads((tmp / f"wandb-{run_id}.json").read_text())


def offline_run_dirs(out: Path) -> list[Path]:
    """The offline runs W&B wrote under out_dir (what `wandb sync` uploads): offline-run-<time>-<id>."""
    return sorted(out.glob("wandb/offline-run-*"))


def run_agent_points(spec: dict, points: list[dict], tmp: Path) -> list[dict]:
    """Run the agent argv of each point at once (parallel agents), cwd=tmp; the program by absolute path."""
    spec = {**spec, "program": str(REPO / spec["program"])}
    procs = []
    for i, pt in enumerate(points):
        run_id = uuid.uuid4().hex[:8]
        argv = sweeps.agent_command(spec, pt)
        assert argv[:3] == ["/usr/bin/env", "python", spec["program"]]
        assert argv[3:] == [f"{k}={v}" for k, v in pt.items()]  # args_no_hyphens: key=value, unchanged
        log = open(tmp / f"agent{i}.log", "w")  # noqa: SIM115
        procs.append((pt, run_id, log, subprocess.Popen(recorded(argv), cwd=tmp, env=agent_env(tmp, run_id, ("offline", None)[i % 2]),
                                                         stdout=log, stderr=subprocess.STDOUT)))
    out = []
    for pt, run_id, log, p in procs:
        rc = p.wait(timeout=300)
        log.close()
        out.append({"point": pt, "run_id": run_id, "rc": rc, "log": Path(log.name).read_text()[-4000:]})
    return out


def agent_points(path: Path, tiny: dict, n: int = 2) -> tuple[dict, list[dict]]:
    spec = sweeps.load_sweep(path)
    extra = tiny_overrides(spec["program"], tiny)
    points = [{**pt, **extra} for pt in sweep_points.sample(spec, n=n, seed=1)]
    return spec, points


# ---------------------------------------------------------------------------------------------
# sweep files: parse, expand, keys
# ---------------------------------------------------------------------------------------------


def test_sweep_files_parse_and_expand():
    names = {p.stem for p in SWEEPS}
    assert {"budgetdraft", "sparsespec_l"} <= names
    programs, methods = set(), set()
    for path in SWEEPS:
        spec = sweeps.load_sweep(path)  # program, method, metric, parameters, command
        programs.add(spec["program"])
        methods.add(spec["method"])
        assert spec["command"] == ["${env}", "${interpreter}", "${program}", "${args_no_hyphens}"]
        assert spec["metric"]["goal"] in ("maximize", "minimize") and spec["metric"]["name"]
        # every run gets its own directory: the W&B run id (set by the agent) is in out_dir
        assert "${oc.env:WANDB_RUN_ID}" in spec["parameters"]["out_dir"]["value"]
        assert spec["parameters"]["logger"]["value"] == "wandb"
        pts = sweep_points.sample(spec, n=25, seed=0)
        for pt in pts:
            assert set(pt) == set(spec["parameters"])
            for k, p in spec["parameters"].items():
                if "value" in p:
                    assert pt[k] == p["value"]
                elif "values" in p:
                    assert pt[k] in p["values"]
                else:
                    assert p["min"] <= pt[k] <= p["max"], (k, pt[k])
        if spec["method"] == "grid":
            everything = sweep_points.grid(spec)
            size = math.prod(1 if "value" in p else len(p["values"]) for p in spec["parameters"].values())
            assert len(everything) == size > 1
            assert len({json.dumps(p, sort_keys=True) for p in everything}) == len(everything)
        else:
            assert len({json.dumps(p, sort_keys=True) for p in pts}) > 1  # really sampled
        # what `check` composes: every listed value and both ends of every range, as the agent sends them
        checked = sweeps.check_points(spec)
        for k, p in spec["parameters"].items():
            seen = [pt[k] for pt in checked]
            if "value" in p or "values" in p:
                assert all(v in seen for v in p.get("values", [p.get("value")])), k
            else:
                assert math.isclose(min(seen), p["min"]) and math.isclose(max(seen), p["max"]), k
                assert all(isinstance(v, float) for v in seen), k  # uniform / log_uniform_values: floats
    assert programs == {"train.py", "evaluate.py"}
    assert methods >= {"bayes", "random", "grid"}

    train = sweeps.load_sweep(CONF / "sweep" / "budgetdraft.yaml")
    assert train["metric"]["name"] == "val/acceptance"
    swept = set(train["parameters"])
    assert {"budget.values", "optim.lr", "drafter.n_layers"} <= swept and {"loss.acc", "loss.kl"} <= swept
    sl = sweeps.load_sweep(CONF / "sweep" / "sparsespec_l.yaml")
    assert {f"method.{k}" for k in ("drafter.policy.ratio", "drafter.policy.window", "drafter.policy.k_sink",
                                    "drafter.policy.k_recent", "controller.candidates",
                                    "controller.beta")} <= set(sl["parameters"])
    assert sl["metric"]["name"] == "speedup"


def test_agent_command_matches_wandb_formatting():
    spec = {"program": "train.py", "command": sweeps.SWEEP_COMMAND}
    argv = sweeps.agent_command(spec, {"optim.lr": 0.001, "budget.values": [256, 512], "export": False})
    assert argv == ["/usr/bin/env", "python", "train.py", "optim.lr=0.001", "budget.values=[256, 512]", "export=False"]


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_swept_key_exists_and_points_compose(path):
    problems = sweeps.check_sweep_file(path, CONF)
    assert problems == []


def test_missing_swept_key_is_detected(tmp_path):
    spec = yaml.safe_load((CONF / "sweep" / "budgetdraft.yaml").read_text())
    spec["parameters"]["optim.lrr"] = {"values": [1e-3]}          # typo of optim.lr
    spec["parameters"]["budget.valuez"] = {"values": [[256]]}      # typo of budget.values
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec))
    compose = sweeps.hydra_compose(CONF, "train")
    assert sweeps.check_sweep_keys(spec["parameters"], compose) == ["optim.lrr", "budget.valuez"]
    problems = sweeps.check_sweep_file(bad, CONF)
    assert sorted(p.split(":")[0] for p in problems) == ["budget.valuez", "optim.lrr"]
    with pytest.raises(Exception, match="lrr"):  # the agent's run would die in Hydra: catch it before
        compose(["optim.lrr=0.001"])
    sl = sweeps.load_sweep(CONF / "sweep" / "sparsespec_l.yaml")
    assert sweeps.check_sweep_keys([*sl["parameters"], "method.windows"], sweeps.hydra_compose(CONF, "evaluate")) \
        == ["method.windows"]


def test_wandb_mode_default(tmp_path):
    none = tmp_path / "none"
    assert tracking.wandb_mode_default({}, netrc_path=none) == "offline"
    assert tracking.wandb_mode_default({"WANDB_API_KEY": "x" * 40}, netrc_path=none) == "online"
    assert tracking.wandb_mode_default({"WANDB_MODE": "disabled", "WANDB_API_KEY": "k"}, netrc_path=none) == "disabled"
    rc = tmp_path / "netrc"
    rc.write_text("machine example.org login a password b\n")
    assert tracking.wandb_mode_default({}, netrc_path=rc) == "offline"
    rc.write_text(f"machine {tracking.WANDB_HOST}\n  login user\n  password {'k' * 40}\n")
    assert tracking.wandb_mode_default({}, netrc_path=rc) == "online"


# ---------------------------------------------------------------------------------------------
# the agent's command lines, run on a tiny model
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def train_sweep_runs(tiny):
    spec, points = agent_points(CONF / "sweep" / "budgetdraft.yaml", tiny)
    tmp = tiny["root"] / "train_sweep"
    tmp.mkdir()
    return spec, tmp, run_agent_points(spec, points, tmp)


@pytest.mark.slow
@pytest.mark.xdist_group("train_sweep")  # one process runs the two training agents for both
def test_train_sweep_points_run_and_log_metric(train_sweep_runs):
    spec, tmp, runs = train_sweep_runs
    metric = spec["metric"]["name"]
    dirs = set()
    for r in runs:
        assert r["rc"] == 0, r["log"]
        out = tmp / "outputs" / "sweeps" / "budgetdraft" / r["run_id"]  # own dir, named by the run id
        dirs.add(out)
        final = json.loads((out / "metrics.json").read_text())["final"]
        assert (out / "drafter" / "config.json").is_file() and (out / "checkpoints" / "last.ckpt").is_file()
        # an offline W&B run (WANDB_MODE=offline for one, unset -> offline default for the other)
        [wrun] = offline_run_dirs(out)
        assert wrun.name.endswith(r["run_id"])
        wb = wandb_record(tmp, r["run_id"])
        assert wb["id"] == r["run_id"] and wb["project"] == "sparsespec"
        assert math.isclose(wb["summary"][metric], final[metric], abs_tol=1e-4)
        assert {"val/acc_full", "train/loss", "trainer/global_step"} <= set(wb["summary"])
        assert any(metric in h for h in wb["history"])
        [art] = [a for a in wb["artifacts"] if a["type"] == "model"]  # the export, logged after training
        assert art["name"] == f"drafter-{r['run_id']}" and "model.safetensors" in art["files"]
        # the composed Hydra config is the run config: the swept values reached Hydra unchanged
        pt, cfg = r["point"], wb["config"]
        assert math.isclose(cfg["optim"]["lr"], pt["optim.lr"], rel_tol=1e-9)
        assert math.isclose(cfg["loss"]["kl"], pt["loss.kl"], rel_tol=1e-9)
        assert cfg["budget"]["values"] == pt["budget.values"]
        assert cfg["drafter"]["n_layers"] == pt["drafter.n_layers"]
        assert cfg["out_dir"] == str(Path("outputs/sweeps/budgetdraft") / r["run_id"])
    assert len(dirs) == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sparsespec_l", "sparsespec_l_grid"])
def test_evaluate_sweep_points_run_and_log_metric(tiny, name):
    spec, points = agent_points(CONF / "sweep" / f"{name}.yaml", tiny)
    tmp = tiny["root"] / name
    tmp.mkdir()
    metric = spec["metric"]["name"]
    runs = run_agent_points(spec, points, tmp)
    for r in runs:
        assert r["rc"] == 0, r["log"]
        out = tmp / "outputs" / "sweeps" / name / r["run_id"]
        rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        assert {row["method"] for row in rows} == {"ar", "sparsespec_l"}
        summary = json.loads((out / "summary.json").read_text())
        [sl] = [e for e in summary if e["method"] == "sparsespec_l"]
        saved = yaml.safe_load((out / "config.yaml").read_text())
        for k, v in r["point"].items():
            if k.startswith("method."):
                got = OmegaConf.select(OmegaConf.create(saved), k)
                assert got == v or (not isinstance(v, list) and math.isclose(got, v)), (k, got, v)
        [wrun] = offline_run_dirs(out)
        assert wrun.name.endswith(r["run_id"])
        wb = wandb_record(tmp, r["run_id"])
        assert wb["id"] == r["run_id"]
        assert math.isclose(wb["summary"][metric], sl[metric]["mean"], rel_tol=1e-9)
        assert math.isclose(wb["summary"]["sparsespec_l/acceptance_rate"], sl["acceptance_rate"]["mean"])
        assert {"sample/sparsespec_l/tokens_per_s", "sample/ar/wall_s", "results", "summary"} <= set(wb["summary"])
        logged = {k: v for h in wb["history"] for k, v in h.items()}
        assert logged["results"] == logged["summary"] == {"_type": "Table"}  # rows and summary as tables
        assert any(k.startswith("plots/") and v == {"_type": "Image"} for k, v in logged.items())  # plots
        assert wb["config"]["method"]["name"] == "sparsespec_l" and wb["config"]["out_dir"].endswith(r["run_id"])
        arts = {a["type"]: a for a in wb["artifacts"]}
        assert {"results.jsonl", "summary.json"} <= set(arts["evaluation"]["files"])


@pytest.mark.slow
@pytest.mark.xdist_group("train_sweep")  # one process runs the two training agents for both
def test_evaluate_logs_the_drafter_artifact(tiny, train_sweep_runs):
    """A budgetdraft evaluation of a drafter exported by a sweep run logs that drafter as an artifact."""
    _, tmp, runs = train_sweep_runs
    r = runs[0]
    export = tmp / "outputs" / "sweeps" / "budgetdraft" / r["run_id"] / "drafter"
    out = tmp / "eval_bd"
    argv = [sys.executable, str(REPO / "evaluate.py"), "method=budgetdraft", f"drafter.path={export}",
            "method.drafter.policy.budget=64", "method.drafter.policy.k_sink=4", "logger=wandb", f"out_dir={out}",
            *[f"{k}={v}" for k, v in tiny_overrides("evaluate.py", tiny).items()]]
    p = subprocess.run(recorded(argv), cwd=tmp, env=agent_env(tmp, "evalbd01", None), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert len(offline_run_dirs(out)) == 1
    wb = wandb_record(tmp, "evalbd01")
    [art] = [a for a in wb["artifacts"] if a["type"] == "model"]
    assert art["name"].startswith("drafter-") and {"config.json", "model.safetensors"} <= set(art["files"])
    assert "budgetdraft/speedup" in wb["summary"] and wb["summary"]["speedup"] == wb["summary"]["budgetdraft/speedup"]


# ---------------------------------------------------------------------------------------------
# Optuna (offline alternative) and the launchers
# ---------------------------------------------------------------------------------------------


def _search_override(name: str) -> str:
    """`hparams_search=<name>`; `+hparams_search=<name>` until conf/train.yaml lists the group."""
    defaults = yaml.safe_load((CONF / "train.yaml").read_text())["defaults"]
    listed = any(isinstance(d, dict) and "hparams_search" in d for d in defaults)
    return f"{'' if listed else '+'}hparams_search={name}"


@pytest.mark.slow
def test_optuna_search_two_trials(tiny, tmp_path):
    sweep_dir = tmp_path / "optuna"
    extra = tiny_overrides("train.py", tiny)
    extra.pop("trainer.max_steps")
    argv = [sys.executable, str(REPO / "train.py"), "-m", _search_override("budgetdraft"), "hydra.sweeper.n_trials=2",
            f"hydra.sweep.dir={sweep_dir}", "logger=none", *[f"{k}={v}" for k, v in extra.items()]]
    p = subprocess.run(argv, cwd=tmp_path, env=agent_env(tmp_path, "unused00", "offline"), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    values, params = [], []
    for trial in ("0", "1"):  # each trial in its own out_dir: <sweep dir>/<job num>
        values.append(json.loads((sweep_dir / trial / "metrics.json").read_text())["final"]["val/acceptance"])
        params.append(yaml.safe_load((sweep_dir / trial / ".hydra" / "overrides.yaml").read_text()))
        assert (sweep_dir / trial / "drafter" / "config.json").is_file()
    assert not (sweep_dir / "2").exists()
    assert params[0] != params[1] and any(o.startswith("optim.lr=") for o in params[0])
    res = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert res["name"] == "optuna" and math.isclose(res["best_value"], max(values), abs_tol=1e-4)


@pytest.mark.parametrize("launcher,target", [("local", "JoblibLauncher"), ("slurm", "SlurmLauncher"),
                                             ("slurm_local", "LocalLauncher")])
def test_launcher_configs_compose(launcher, target):
    from hydra import compose, initialize_config_dir

    for name in ("train", "evaluate"):
        with initialize_config_dir(str(CONF), version_base="1.3"):
            cfg = compose(name, overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
        assert cfg.hydra.launcher._target_.endswith(target)
        assert OmegaConf.select(cfg, "hydra.launcher.n_jobs" if launcher == "local" else "hydra.launcher.timeout_min")


@pytest.mark.slow
def test_sweep_script_checks_and_never_prompts(tmp_path):
    script = REPO / "scripts" / "sweep.sh"
    env = agent_env(tmp_path, "unused01", None)
    env.pop("WANDB_RUN_ID")
    env["PYTHON"] = sys.executable
    ok = subprocess.run([str(script), "check"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert all(f"{p.name}: ok" in ok.stdout for p in SWEEPS)
    spec = yaml.safe_load((CONF / "sweep" / "sparsespec_l.yaml").read_text())
    spec["parameters"]["method.ration"] = {"values": [0.1]}
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(spec))
    bad = subprocess.run([str(script), "check", str(tmp_path / "typo.yaml")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode != 0 and "method.ration: not a key" in bad.stdout
    # W&B not configured: `create` stops with a message (exit 2) instead of a login prompt
    p = subprocess.run([str(script), "create", str(CONF / "sweep" / "budgetdraft.yaml")], env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "W&B is not configured" in p.stderr and "hparams_search" in p.stderr

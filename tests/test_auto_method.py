"""method=auto: the planner's pick under the run's settings stands in for `auto`, before anything
loads; it is a method that was measured (never one priced with another's acceptance)."""
import pytest

from sparsespec.checks import ConfigError
from sparsespec.eval import auto
from sparsespec.eval.cli import compose_run
from sparsespec.plan import best

pytestmark = pytest.mark.embedded  # the planner reads the embedded model's config.json


def test_auto_is_the_planners_best_for_the_runs_context():
    for ctx in ("4k", "64k"):
        run = compose_run(["method=auto", f"ctx={ctx}", "limit=1"])
        (method,) = run.methods
        assert method.name != "auto" and f"method={method.name}" in run.cfg.out_dir
        config = auto._model_config(None)
        assert method.name == best(config, {"4k": 4096, "64k": 65536}[ctx], 1, "cpu", stand_ins=False).method


def test_auto_in_a_list_keeps_the_others_and_no_duplicate():
    run = compose_run(["method=[ar,auto]", "ctx=64k"])
    names = [m.name for m in run.methods]
    assert names[0] == "ar" and "auto" not in names and len(names) == len(set(names))


def test_auto_without_a_profile_for_the_device_is_refused(monkeypatch):
    monkeypatch.setattr(auto, "_profile", lambda device: (_ for _ in ()).throw(
        ConfigError("method=auto: no device profile for tpu; name a method")))
    with pytest.raises(ConfigError, match="method=auto: no device profile"):
        compose_run(["method=auto", "ctx=4k"])

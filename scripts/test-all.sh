#!/usr/bin/env bash
# The whole test-suite with its real services: what `make test` and CI run.
# Installs and starts every service the end-to-end tests need (root, Debian/Ubuntu), runs pytest over
# all markers except `gpu`, and stops what it started (by PID) on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PWD/.cache/bin:$PATH"

log() { printf '\n==> %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

# Phase times: printed at the end (and on failure), so growth shows the day it happens.
PHASES=()
phase_start=$SECONDS
phase() {  # phase NAME: close the running phase under NAME and start the next one
  PHASES+=("$(printf '%-40s %5d s' "$1" $((SECONDS - phase_start)))")
  phase_start=$SECONDS
}
print_phases() {
  printf '\n==> phase times\n'
  printf '  %s\n' "${PHASES[@]}"
  printf '  %-40s %5d s\n' "total" "$SECONDS"
}
#: The test phase's budget on a quiet 2-core machine; CI fails past 1.5 times it (a wide margin: the machine may
#: be shared), so a suite that grows is seen before it reaches CI's hard limit (90 min in all). Measured on a
#: fresh clone, quiet machine: see the README's "make test" section.
TESTS_BUDGET_S=${TESTS_BUDGET_S:-2100}

cleanup() {
  if [[ -n ${tiny_pid:-} ]]; then kill "$tiny_pid" 2>/dev/null || true; fi  # a failed set-up leaves no build behind
  log "stopping services"
  scripts/ci/slurm-down.sh || true
  print_phases
}
trap cleanup EXIT

# The tiny models train on the CPU while the services below install (mostly downloads and disk): built alongside.
mkdir -p ci-artifacts
log "tiny local models: building in the background (log: ci-artifacts/tiny-build.log)"
longhaul tiny build >ci-artifacts/tiny-build.log 2>&1 &
tiny_pid=$!
log "Slurm (one node, fake GPUs)"
scripts/ci/slurm-up.sh
log "kubectl, helm, kopf, kmock"
scripts/ci/k8s-tools.sh
log "Chromium for the MLflow UI test"
scripts/ci/chromium.sh
log "container builders and the local Debian base"
scripts/ci/images-setup.sh
# The vLLM servers run on the project venv's python (vLLM's CPU build beside veRL, `make install`).
export LONGHAUL_VLLM_PYTHON="$PWD/$VENV/bin/python"
phase "services and tools (Slurm, k8s, chromium, podman)"
# Lint while the build finishes (seconds of CPU; the build is on the critical path, lint need not be).
log "lint: ruff (check, format)"
ruff check pipelines tests scripts benchmarks operator
ruff format --check pipelines tests scripts benchmarks operator
phase "lint"
log "tiny local models: waiting for the build"
tiny_rc=0; wait "$tiny_pid" || tiny_rc=$?
cat ci-artifacts/tiny-build.log
if (( tiny_rc != 0 )); then echo "longhaul tiny build failed (exit $tiny_rc)" >&2; exit "$tiny_rc"; fi
phase "tiny models (the rest of the build)"

# The browser tests' screenshots (MLflow's compare page, an episode's trace) are kept here as CI artefacts.
export LONGHAUL_BROWSER_SHOTS="${LONGHAUL_BROWSER_SHOTS:-$PWD/ci-artifacts/screenshots}"
rc=0
# One pytest session, two workers (both cores), a file to a worker: every pipeline test (trainer, Ray, vLLM
# servers, their Slurm jobs) in one lane, one at a time and started first, the critical path; the other worker runs
# every other file beside it — Slurm, images, Kubernetes, then the unit tests — and is done before it
# (tests/conftest.py). Unit tests in a phase of their own would add their minutes to that path.
# The host's speed right now, before and after (a shared machine drifts by a third within an hour): compare phase
# times between runs together with it.
python scripts/ci/speed-probe.py "before the tests" || true
cpu_mark=$(mktemp)
python scripts/ci/cpu-usage.py start "$cpu_mark" || true
log "pytest: unit, end-to-end and reliability tests (2 workers, lanes)"
python -m pytest tests/unit tests/e2e tests/reliability -n 2 --dist loadgroup --no-loadscope-reorder -m "not gpu" \
  -ra --durations=30 "$@" || rc=$?
took=$((SECONDS - phase_start))
phase "tests (unit, end-to-end, reliability)"
python scripts/ci/speed-probe.py "after the tests" || true
# Busy and idle core-seconds of the test phase: idle cores mean overlap would help, busy ones that only less work will.
python scripts/ci/cpu-usage.py report "$cpu_mark" "the tests" || true
rm -f "$cpu_mark"
if (( took * 2 > TESTS_BUDGET_S * 3 )); then
  echo "the test phase took ${took} s, over 1.5 x its budget of ${TESTS_BUDGET_S} s: make the suite faster" >&2
  rc=1
fi
log "pytest done (exit $rc)"
exit "$rc"

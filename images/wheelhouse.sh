#!/usr/bin/env bash
# Make the wheelhouse for one stack: every wheel the image installs, so the image build itself never reaches
# a package index (`pip install --no-index --find-links /wheelhouse`). Run it where PyPI is reachable, with
# the image's Python version (cuda stacks: 3.12, e.g. inside the builder image; cpu stacks: the host's 3.11).
#   images/wheelhouse.sh STACK [OUT]        OUT defaults to build/wheelhouse/STACK
# Environment: PYTHON (interpreter whose pip is used, default python3); FLASH_ATTN_WHEEL (a prebuilt
# flash-attn wheel to copy in; see below). Reruns with unchanged inputs return at once.
set -euo pipefail

STACK=${1:?usage: images/wheelhouse.sh STACK [OUT]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${2:-$ROOT/build/wheelhouse/$STACK}
PY=${PYTHON:-python3}
SDIR=$ROOT/images/stacks/$STACK
if [ ! -f "$SDIR/stack.env" ]; then
  echo "unknown stack '$STACK'; valid: $(cd "$ROOT/images/stacks" && echo */ | tr -d /)" >&2
  exit 2
fi
# shellcheck source=/dev/null
source "$SDIR/stack.env"

mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
{
  "$PY" "$ROOT/images/project-requirements.py" "$ROOT/pyproject.toml" --extras "${PROJECT_EXTRAS:-}"
  grep -v -E '^[[:space:]]*flash-attn' "$SDIR/requirements.txt" || true
  # Build backend of the project wheel (built inside the image, offline, with build isolation).
  echo "setuptools>=68"
  echo "wheel"
} >"$work/requirements.txt"

key=$(cat "$work/requirements.txt" "$SDIR/constraints.txt" <("$PY" -VV) | sha256sum | cut -c1-16)
if [ -f "$OUT/.wheelhouse-$key" ]; then
  echo "wheelhouse $OUT is up to date ($(ls "$OUT"/*.whl | wc -l) wheels)"
  exit 0
fi

# pip wheel downloads wheels as they are and builds the few source-only (pure Python) packages into wheels.
"$PY" -m pip wheel --quiet --wheel-dir "$OUT" -c "$SDIR/constraints.txt" -r "$work/requirements.txt"

# flash-attn is source-only on PyPI and its build imports torch and CUDA: it cannot come from `pip wheel`
# above. Build it with images/flash-attn-wheel.sh STACK in the stack's builder image (CUDA toolkit, torch from
# this wheelhouse, pinned build dependencies, --no-build-isolation; step by step in images/README.md, section
# "flash-attn wheel"), then rerun this script with FLASH_ATTN_WHEEL=build/flash-attn/STACK/flash_attn-*.whl.
# A prebuilt wheel for exactly the stack's CUDA x torch x Python x cxx11abi works too (FLASH_ATTN_WHEEL=path).
fa=$(grep -E '^[[:space:]]*flash-attn==' "$SDIR/requirements.txt" | sed -E 's/.*==//' || true)
if [ -n "$fa" ]; then
  if [ -n "${FLASH_ATTN_WHEEL:-}" ]; then
    cp "$FLASH_ATTN_WHEEL" "$OUT/"
  fi
  if ! ls "$OUT"/flash_attn-"$fa"*.whl >/dev/null 2>&1; then
    echo "wheelhouse $OUT has no flash_attn-$fa wheel: set FLASH_ATTN_WHEEL or build it (see $0)" >&2
    exit 3
  fi
fi
touch "$OUT/.wheelhouse-$key"
echo "wheelhouse $OUT: $(ls "$OUT"/*.whl | wc -l) wheels, $(du -sh "$OUT" | cut -f1)"

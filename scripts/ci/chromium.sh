#!/usr/bin/env bash
# Install Debian's Chromium and chromedriver for the `browser` tests (MLflow UI in headless Chromium).
# Idempotent: does nothing when both are present. Runs `apt-get update` at most once (when the package lists
# are missing or stale). Usage, as root or with sudo: scripts/ci/chromium.sh
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  echo "chromium already installed: $(chromium --version 2>/dev/null || echo unknown)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
APT=(-o DPkg::Lock::Timeout=600)
PKGS=(chromium chromium-driver fonts-dejavu-core)

install() { $SUDO apt-get "${APT[@]}" install -y --no-install-recommends "${PKGS[@]}"; }

if apt-cache show chromium >/dev/null 2>&1 && apt-cache show chromium-driver >/dev/null 2>&1 && install; then
  :
else
  # Lists missing (fresh image) or stale (a download 404s): refresh once and retry.
  $SUDO apt-get "${APT[@]}" update
  install
fi
echo "installed: $(chromium --version)"

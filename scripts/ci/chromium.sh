#!/usr/bin/env bash
# Install Debian's headless-capable Chromium and its chromedriver for the `browser` tests (idempotent).
# Usage (as root, or with sudo available): scripts/ci/chromium.sh
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  echo "chromium already installed: $(chromium --version 2>/dev/null || echo unknown)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
APT=(-o DPkg::Lock::Timeout=600)
# One index refresh; skip it when the lists are fresh enough that the packages resolve already.
if ! apt-cache show chromium >/dev/null 2>&1 || ! apt-cache show chromium-driver >/dev/null 2>&1; then
  $SUDO apt-get "${APT[@]}" update
fi
$SUDO apt-get "${APT[@]}" install -y --no-install-recommends chromium chromium-driver fonts-dejavu-core
echo "installed: $(chromium --version)"

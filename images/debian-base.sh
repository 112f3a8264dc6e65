#!/usr/bin/env bash
# Build a minimal Debian bookworm base image locally (no registry pull) and import it into podman/buildah
# storage. CI uses it in place of the CUDA bases, which cannot be pulled there:
#   podman build --build-arg BUILDER_IMAGE=localhost/longhaul-base:bookworm \
#                --build-arg BASE_IMAGE=localhost/longhaul-base:bookworm ...
# Usage: images/debian-base.sh [IMAGE]   (default localhost/longhaul-base:bookworm; FORCE=1 rebuilds)
# Needs root, mmdebstrap and podman (scripts/ci/images-setup.sh installs them). About 90 s on 2 cores.
set -euo pipefail

IMAGE=${1:-localhost/longhaul-base:bookworm}
SUITE=${SUITE:-bookworm}
if [ "${FORCE:-0}" != 1 ] && podman image exists "$IMAGE"; then
  echo "base image $IMAGE exists (FORCE=1 rebuilds)"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# --variant=apt keeps apt-get (the Dockerfiles install python3-venv with it); docs, man pages and locales
# are dropped to keep the tarball small. The host's apt sources are copied in, so apt works during builds.
mmdebstrap --variant=apt --mode=root \
  --include=python3-minimal,libpython3.11-stdlib,ca-certificates \
  --aptopt='APT::Install-Recommends "false"' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  "$SUITE" "$work/rootfs.tar"
podman import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  "$work/rootfs.tar" "$IMAGE"
podman image inspect --format '{{.Id}} {{.Size}}' "$IMAGE"
